"""The per-node job executor (``python -m bootstrap_scripts.jobs.executor``): starts and stops
its node's shares of every published job. It imports the shared core (``engine``) only."""
