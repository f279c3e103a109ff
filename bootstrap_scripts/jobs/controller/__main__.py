"""``python -m bootstrap_scripts.jobs.controller``: the controller, as its unit starts it."""

import sys

from bootstrap_scripts.jobs.controller.daemon import main

sys.exit(main())
