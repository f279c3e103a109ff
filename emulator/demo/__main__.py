"""``python -m emulator.demo`` (what ``make demo`` runs)."""

import sys

from emulator.demo.cli import main

sys.exit(main())
