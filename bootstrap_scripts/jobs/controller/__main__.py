"""``python -m bootstrap_scripts.jobs.controller``: the controller, as its unit starts it."""

import sys

from bootstrap_scripts.jobs.controller.entry import main

sys.exit(main())
