"""``python -m bootstrap_scripts.jobs.executor``: the executor program, as its unit starts it."""

import sys

from bootstrap_scripts.jobs.executor.daemon import main

sys.exit(main())
