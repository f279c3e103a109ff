"""Where the code that the constructs ship lives, found from the installed packages.

Constructs must work when imported from a wheel in someone else's CDK app, so they locate
the Lambda code and node scripts through the imported packages, never through the current
working directory.
"""

from __future__ import annotations

from pathlib import Path

import bootstrap_scripts
import lambda_src

#: Files that must never be shipped inside an asset (and would churn asset hashes).
ASSET_EXCLUDES = ["__pycache__", "*.pyc", "*.pyo", ".pytest_cache"]


def lambda_source_dir() -> Path:
    """Directory deployed as the capacity-adjuster Lambda's code asset."""
    return Path(lambda_src.__file__).resolve().parent


def node_scripts_dir() -> Path:
    """Directory shipped to every node (node agent, job executor, runner, health check)."""
    return Path(bootstrap_scripts.__file__).resolve().parent
