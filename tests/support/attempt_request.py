"""The managed request a ``dl-run`` command line submits (command generation, no processes)."""

from __future__ import annotations

from bootstrap_scripts.jobs.cli.dl_run import build_parser, split_command
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from bootstrap_scripts.protocol.managed_records import ManagedRequest


def request(*options: str) -> ManagedRequest:
    """The managed request ``dl-run [options] -- python train.py`` submits."""
    opts, command = split_command([*options, "--cwd", "/efs/code", "--", "python", "train.py"])
    run = request_from_args(build_parser().parse_args(opts), command, "train-1")
    return ManagedRequest(job_id="train-1", run=run, submitted_at=1.0)

