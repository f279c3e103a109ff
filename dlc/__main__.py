"""``python -m dlc``: the same as the ``dlc`` console script."""

import sys

from dlc.cli import main

sys.exit(main())
