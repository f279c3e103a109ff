"""The job engine's shared core, used by every program of ``bootstrap_scripts.jobs``.

Nothing here imports ``cli``, ``executor`` or ``controller``: outcomes and exit codes, the
launch plan (launchers), watching and summarizing a job, reachability, the restart policy
and the managed jobs' records on EFS.
"""
