"""``dl-run -- no-such-command`` (and so ``dlc submit``, which runs it on the master as the
user) is refused at submit, naming the command, instead of being queued to fail later with
the cause under the launcher's traceback; what cannot be known yet (a relative path into a
shipped directory) is left to the executor."""

from __future__ import annotations

from bootstrap_scripts.jobs.engine.command_check import submit_problem
from bootstrap_scripts.protocol.paths import ClusterPaths


def test_the_check(tmp_path):
    path = {"PATH": "/usr/bin:/bin"}
    assert submit_problem(["sh", "-c", "true"], path, "/") == ""
    assert submit_problem(["no-such-command-xyz"], path, "/") == \
        "cannot start 'no-such-command-xyz': not found in PATH"
    assert "no such executable file" in submit_problem([str(tmp_path / "nope")], path, "/")
    assert submit_problem(["./run.sh"], path, str(tmp_path)) == ""  # maybe shipped later
    # a module or a script the launcher runs with the interpreter: nothing to find in PATH
    # (the managed path refused `-- -m pkg.train` and `-- train.py`, which torchrun runs)
    assert submit_problem(["-m", "pkg.train", "--lr", "1"], path, "/") == ""
    assert submit_problem(["train.py", "--epochs", "1"], path, "/") == ""


def test_dl_run_refuses_a_command_no_node_could_start(emu):
    c = emu(1)
    c.start_executors()
    res = c.run("--", "no-such-command-xyz", "--epochs", "1", managed=True, timeout=60)
    assert res.returncode == 2, res.stdout
    assert "cannot start 'no-such-command-xyz': not found in PATH" in res.stdout
    assert "nothing was submitted" in res.stdout
    assert not list(ClusterPaths(c.efs).managed_dir.rglob("request.json"))
