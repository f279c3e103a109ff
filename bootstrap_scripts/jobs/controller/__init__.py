"""The master's job controller (``python -m bootstrap_scripts.jobs.controller``): runs managed
jobs as attempts and restarts them after faults. It imports the shared core (``engine``)
only."""
