"""The demo's options as ``make demo ARGS=…`` parses and checks them, and the ``dl-run``
command line the demo would run on the master (no cluster)."""

from __future__ import annotations

import io
import types
from pathlib import Path

from rich.console import Console

from emulator.demo.cli import build_parser, validate
from emulator.demo.orchestration import Demo
from emulator.resources import loopback_instances


def parsed(*args: str):
    parser = build_parser()
    ns = parser.parse_args(list(args))
    validate(ns, parser)
    return ns


def job_argv(tmp_path: Path, monkeypatch, *args: str) -> list[str]:
    """The ``dl-run`` command line the demo would run on the master."""
    ns = parsed("--work-dir", str(tmp_path / "work"), *args)
    demo = Demo(ns, Console(file=io.StringIO(), width=200))
    master = types.SimpleNamespace(root=tmp_path / "node0",
                                   address=loopback_instances(1)[0].address)
    monkeypatch.setattr(demo, "master", lambda: master)
    seen: list[list[str]] = []
    monkeypatch.setattr(demo, "follow_job", lambda argv, *_: seen.append(argv))
    demo.run_job(world_sizes=[3])
    return seen[0]

