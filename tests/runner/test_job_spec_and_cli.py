"""Job spec round trip, job ids, and the runner's command-line handling (no processes)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_run as runner
from bootstrap_scripts.jobs.cli import request_args
from bootstrap_scripts.protocol import jobs as js
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.paths import validate_job_id
from tests.conftest import REPO_ROOT


def test_spec_round_trips_and_finds_shares():
    spec = js.JobSpec(
        job_id="train-1", launcher="tf",
        shares=(js.Share(0, "10.0.0.4", (js.Proc(("python3", "t.py"), {"TF_CONFIG": "{}"}, "ps",
                                                 False),)),
                js.Share(1, "10.0.1.5", (js.Proc(("python3", "t.py")),))),
        env={"PATH": "/usr/bin"}, cwd="/efs/code", created_at=1.5, grace_seconds=2.0)
    back = js.JobSpec.from_json(spec.to_json())
    assert back == spec
    assert back.share_for("10.0.1.5").rank == 1
    assert back.share_for("10.9.9.9") is None


@pytest.mark.parametrize("bad", ["", "../etc", ".hidden", "a/b", "x" * 129, "sp ace"])
def test_bad_job_ids_are_rejected_by_name(bad):
    with pytest.raises(ProtocolError, match="invalid job id"):
        validate_job_id(bad)


def test_generated_job_ids_are_valid_and_unique():
    ids = {js.new_job_id("my job/../x") for _ in range(50)}
    assert len(ids) == 50
    assert all(i.startswith("my-job-..-x-") or i.startswith("my-job") for i in ids)
    for i in ids:
        validate_job_id(i)


def test_malformed_spec_names_the_problem():
    with pytest.raises(js.JobSpecError,
                       match=r"^job spec field 'shares': expected a JSON array, got NoneType$"):
        js.JobSpec.from_json('{"job_id": "a", "launcher": "each"}')
    with pytest.raises(js.JobSpecError, match="empty command"):
        js.JobSpec.from_json('{"job_id": "a", "launcher": "each", "shares": '
                             '[{"rank": 0, "address": "10.0.0.1", "procs": [{"argv": []}]}]}')


@pytest.mark.parametrize(("argv", "opts", "cmd"), [
    (["--", "-m", "pkg.train", "--lr", "1"], [], ["-m", "pkg.train", "--lr", "1"]),
    (["--launcher", "mpi", "./hello", "-n", "3"], ["--launcher", "mpi"], ["./hello", "-n", "3"]),
    (["--dry-run", "train.py"], ["--dry-run"], ["train.py"]),
    (["--nnodes", "1:4", "--", "train.py"], ["--nnodes", "1:4"], ["train.py"]),
    (["--dry-run"], ["--dry-run"], []),
    (["--env", "A=1", "--elastic", "t.py", "--env"], ["--env", "A=1", "--elastic"],
     ["t.py", "--env"]),
])
def test_split_command(argv, opts, cmd):
    assert runner.split_command(argv) == (opts, cmd)


def test_bad_env_and_missing_membership_are_usage_errors(tmp_path, capsys):
    assert runner.main(["--root", str(tmp_path), "--", "t.py"]) == runner.EXIT_USAGE
    assert "no membership at" in capsys.readouterr().err
    parser_args = runner.build_parser().parse_args(["--env", "DL_TEST_NOT_SET_ANYWHERE"])
    with pytest.raises(runner.RunError, match="DL_TEST_NOT_SET_ANYWHERE is not set"):
        request_args.job_env(parser_args)
    parser_args = runner.build_parser().parse_args(["--env", "=VALUE"])
    with pytest.raises(runner.RunError, match="not a variable name"):
        request_args.job_env(parser_args)


#: ``dl-run [options] -- -m module``: works (torchrun takes it), but the documented form
#: is ``dl-run -- python -m module`` (docs/runner.md: a leading python is the job's
#: interpreter); two spellings in the docs read as two different things.
BARE_MODULE = re.compile(r"dl-run\b[^\n`\"]*? -- +-m ")


def test_every_printed_and_documented_dl_run_example_uses_python_dash_m():
    root = Path(REPO_ROOT)
    files = [root / "README.md", root / "CONTRIBUTING.md", *sorted((root / "docs").glob("*.md")),
             *sorted((root / "emulator").rglob("*.py")),
             *sorted((root / "bootstrap_scripts").rglob("*.py"))]
    found = [f"{f.relative_to(root)}:{n}: {line.strip()}" for f in files
             for n, line in enumerate(f.read_text().splitlines(), 1) if BARE_MODULE.search(line)]
    assert not found, "write `dl-run -- python -m …`:\n" + "\n".join(found)
    assert BARE_MODULE.search("dl-run --elastic -- -m bootstrap_scripts.examples.train_digits")
