"""The user's commands: ``dl-run`` (``dl_run``, with ``submit`` and ``follow`` for managed
jobs) and ``dl-jobs`` (``dl_jobs``). They import the shared core (``engine``) only."""
