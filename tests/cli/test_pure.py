"""dlc without AWS: argument errors and their exit codes, choosing the cluster, the helpers
that build remote commands, and parsing what the master and the Price List answer."""

from __future__ import annotations

import json
import re
from decimal import Decimal
from pathlib import Path

import pytest

from bootstrap_scripts.jobs.cli import dl_run
from bootstrap_scripts.jobs.cli.request_args import request_from_args
from constructs_lib.operator_document import COMMANDS, document_content
from dlc import cost, errors, jobs, remote, session, status
from dlc.cli import main
from dlc.errors import NotFound, UsageError
from dlc.target import Target, resolve
from tests.support.document import run_document_script


def state_file(tmp_path: Path, **aws) -> Path:
    p = tmp_path / "state.json"
    block = {"endpoint": "http://localhost:4566", "region": "eu-west-1",
             "access_key_id": "AK", "secret_access_key": "SK", "session_token": "ST", **aws}
    p.write_text(json.dumps({"endpoint": block["endpoint"], "aws": block}))
    return p


# -- usage errors: exit 2, before any AWS call -----------------------------------------------


@pytest.mark.parametrize("argv", [
    ["submit"],                                  # no command
    ["nosuchcommand"],
    ["status", "--bogus"],
    ["scale"],                                   # neither --workers nor --remove
    ["scale", "--workers", "2", "--remove", "10.0.0.1"],
    ["tunnel", "0", "--dry-run"],                # not a port
    ["tunnel", "8080", "--local-port", "70000", "--dry-run"],
    ["submit", "--max-restarts", "-1", "--", "true"],
    ["submit", "--data", "my-data/x", "--", "true"],              # not s3://
    ["submit", "--data-checksums", "required", "--", "true"],     # without --data
    ["submit", "--data", "s3://my-data/x", "--data-checksums", "strict", "--", "true"],
    ["up", "-c", "workerCount"],                 # not key=value
])
def test_usage_errors_exit_2(argv: list[str], capsys) -> None:
    assert main(argv) == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert err.strip(), "a usage error must say what is wrong"


def test_bad_context_names_the_value(capsys) -> None:
    assert main(["up", "-c", "workerCount"]) == 2
    assert "'workerCount'" in capsys.readouterr().err


def test_scale_usage_names_both_options(capsys) -> None:
    assert main(["scale"]) == 2
    assert "--workers N, --remove ADDRESS, --replace ADDRESS or --status" in \
        capsys.readouterr().err


def test_missing_emulator_state_is_not_found(tmp_path: Path, capsys) -> None:
    assert main(["--emulator", str(tmp_path / "nope.json"), "status"]) == errors.EXIT_NOT_FOUND
    assert "nope.json does not exist" in capsys.readouterr().err


def test_profile_and_emulator_exclude_each_other(tmp_path: Path, capsys) -> None:
    state = state_file(tmp_path)
    assert main(["--emulator", str(state), "--profile", "x", "status"]) == 2
    assert "exclude each other" in capsys.readouterr().err


# -- choosing the cluster --------------------------------------------------------------------


def test_emulator_state_supplies_endpoint_region_credentials(tmp_path: Path) -> None:
    t = resolve(emulator=str(state_file(tmp_path)), environ={})
    assert (t.stack, t.region, t.endpoint) == ("DLClusterStack", "eu-west-1",
                                               "http://localhost:4566")
    assert t.credentials == {"access_key_id": "AK", "secret_access_key": "SK",
                             "session_token": "ST"}
    env = t.cli_env()
    assert env["AWS_ENDPOINT_URL"] == "http://localhost:4566"
    assert env["AWS_ACCESS_KEY_ID"] == "AK" and env["AWS_REGION"] == "eu-west-1"


def test_options_win_over_state_and_environment(tmp_path: Path) -> None:
    t = resolve(stack="Other", region="us-west-2", environ={
        "DLC_EMULATOR": str(state_file(tmp_path))})
    assert (t.stack, t.region, t.endpoint) == ("Other", "us-west-2", "http://localhost:4566")


def test_plain_aws_target_takes_the_environment_region() -> None:
    t = resolve(environ={"AWS_REGION": "ap-south-1"})
    assert (t.region, t.endpoint, t.credentials) == ("ap-south-1", "", {})


def test_no_region_anywhere_is_a_usage_error(monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    with pytest.raises(UsageError, match="no AWS region") as exc:
        resolve(environ={})
    assert "export DLC_EMULATOR=" in str(exc.value)  # a new terminal that meant the emulator


def test_no_credentials_mention_the_emulator(monkeypatch, tmp_path: Path) -> None:
    from botocore.exceptions import NoCredentialsError

    from dlc import aws as dlc_aws

    err = dlc_aws.aws_error(NoCredentialsError(), "an AWS call")
    assert "aws configure" in str(err) and "export DLC_EMULATOR=" in str(err)


def test_state_of_an_older_demo_says_so(tmp_path: Path) -> None:
    p = tmp_path / "state.json"
    p.write_text(json.dumps({"endpoint": "http://localhost:1"}))
    with pytest.raises(UsageError, match=r"lacks aws\.region"):
        resolve(emulator=str(p), environ={})


# -- remote commands ------------------------------------------------------------------------


def test_submit_argv() -> None:
    argv = jobs.submit_argv(("python", "train.py", "--lr", "0.1"), launcher="mpi",
                            max_restarts=2, min_nodes=3, name="n1")
    assert argv == ["dl-run", "--detach", "--json", "--launcher", "mpi", "--max-restarts",
                    "2", "--min-nodes", "3", "--name", "n1", "--", "python", "train.py",
                    "--lr", "0.1"]
    assert jobs.submit_argv(("true",), launcher=None, max_restarts=None, min_nodes=None,
                            name=None) == ["dl-run", "--detach", "--json", "--", "true"]


def test_submit_resume_from_is_checked_and_passed_to_dl_run() -> None:
    argv = jobs.submit_argv(("t",), launcher=None, max_restarts=None, min_nodes=None,
                            name=None, resume_from="s3://old-ck/checkpoints/c0/alice/j1")
    assert argv[3:6] == ["--resume-from", "s3://old-ck/checkpoints/c0/alice/j1/", "--"]
    remote.document_parameters(argv, timeout=9)  # the document's patterns take it
    for bad in ("old-ck/x", "s3://Old_Ck/x", "s3://old-ck/../x"):
        with pytest.raises(UsageError, match=re.escape(f"--resume-from {bad!r}")):
            jobs.submit_argv(("t",), launcher=None, max_restarts=None, min_nodes=None,
                             name=None, resume_from=bad)
    assert jobs.checkpoint_text({"checkpoint": {"efs": "/efs/c/a.manifest.json",
                                                "s3": "s3://b/p/a.manifest.json"}}) == \
        "/efs/c/a.manifest.json\ns3://b/p/a.manifest.json"
    assert jobs.checkpoint_text({}) == "-"


def test_submit_elastic_and_nnodes_reach_dl_run_as_given() -> None:
    """``dlc submit --elastic --nnodes 1:4`` (spares beyond MAX) reaches dl-run through the
    document's patterns and dl-run's parser; a bad --nnodes is refused on the laptop with
    the launcher's own rule, naming the value."""
    argv = jobs.submit_argv(("t",), launcher=None, max_restarts=None, min_nodes=None,
                            name=None, elastic=True, nnodes="1:4")
    assert argv[3:7] == ["--elastic", "--nnodes", "1:4", "--"]
    remote.document_parameters(argv, timeout=9)
    opts, command = dl_run.split_command(argv[1:])
    request = request_from_args(dl_run.build_parser().parse_args(opts), command, "j1")
    assert (request.elastic, request.nnodes) == (True, "1:4")
    for bad in ("4:1", "0:2", "a", "1:2:3"):
        with pytest.raises(UsageError, match=re.escape(repr(bad))):
            jobs.submit_argv(("t",), launcher=None, max_restarts=None, min_nodes=None,
                             name=None, nnodes=bad)


@pytest.mark.parametrize(("launcher", "nnodes", "named"), [
    ("mpi", None, "'mpi'"), ("horovod", "1:4", "'horovod'"), ("each", None, "'each'"),
    (None, "3", "'3'"), ("torchrun", "2", "'2'")])
def test_submit_elastic_is_refused_on_the_laptop_by_dl_runs_own_rule(
        tmp_path: Path, launcher, nnodes, named) -> None:
    """``--elastic`` with a launcher other than torchrun, or with a single --nnodes N, is
    refused by ``dlc submit`` (exit 2, naming the value) with the message dl-run gives on
    the master: the rule has one home (``protocol.nnodes.check_torchrun_options``)."""
    from bootstrap_scripts.jobs.engine import run as engine
    from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError
    from bootstrap_scripts.protocol.membership import build_membership
    from bootstrap_scripts.protocol.run_request import RunRequest

    with pytest.raises(UsageError, match=re.escape(named)) as laptop:
        jobs.submit_argv(("t",), launcher=launcher, max_restarts=None, min_nodes=None,
                         name=None, elastic=True, nnodes=nnodes)
    assert laptop.value.exit_code == 2
    request = RunRequest(job_id="j", command=("t.py",), launcher=launcher or "torchrun",
                         elastic=True, nnodes=nnodes or "")
    m = build_membership(cluster_id="c", generation=1, workers=[],
                         master={"instance_id": "i-m", "address": "10.0.0.4"})
    with pytest.raises(RunError) as master:
        engine.prepare(request, m, tmp_path)
    assert master.value.code == EXIT_USAGE and str(master.value) == str(laptop.value)
    assert jobs.submit_argv(("t",), launcher="mpi", max_restarts=None, min_nodes=None,
                            name=None)[3:5] == ["--launcher", "mpi"]  # not elastic: fine


def test_submit_data_is_checked_with_dl_runs_parser_and_passed_through() -> None:
    """--data, --data-shard and --data-checksums reach dl-run as given; a bad value is a
    UsageError naming the option and value on the laptop, as dl-run would refuse it."""
    def argv_of(**kw) -> list[str]:
        return jobs.submit_argv(("t",), launcher=None, max_restarts=None, min_nodes=None,
                                name=None, **kw)
    assert argv_of(data="s3://my-data/digits") == \
        ["dl-run", "--detach", "--json", "--data", "s3://my-data/digits", "--", "t"]
    argv = argv_of(data="s3://my-data/digits/:/scratch/d", data_shard=True,
                   data_checksums="required")
    assert argv[3:9] == ["--data", "s3://my-data/digits/:/scratch/d", "--data-shard",
                         "--data-checksums", "required", "--"]
    remote.document_parameters(argv, timeout=9)  # the document's patterns take it
    opts, command = dl_run.split_command(argv[1:])  # and dl-run reads it back as given
    request = request_from_args(dl_run.build_parser().parse_args(opts), command, "j1")
    assert (request.data, request.data_shard, request.data_checksums) == \
        ("s3://my-data/digits/:/scratch/d", True, "required")
    assert argv_of(data="s3://my-data/x", data_checksums="warn")[5:7] == \
        ["--data-checksums", "warn"]
    for bad in ("my-data/x", "s3://My_Data/x", "s3://my-data/../x", "s3://my-data/x:rel"):
        with pytest.raises(UsageError, match="--data"):
            argv_of(data=bad)
    with pytest.raises(UsageError, match="--data-checksums must be one of warn, required, "
                                         "got 'strict'"):
        argv_of(data="s3://my-data/x", data_checksums="strict")
    with pytest.raises(UsageError, match="--data-checksums required checks what --data"):
        argv_of(data_checksums="required")
    with pytest.raises(UsageError, match="--data-shard shards what --data stages"):
        argv_of(data_shard=True)


@pytest.mark.parametrize(("data", "shard", "mode"), [
    (None, True, None),                  # --data-shard without --data
    (None, False, "required"),           # --data-checksums without --data
    (None, False, "warn"),
    ("my-data/x", False, None),          # not s3://
    ("s3://my-data/x", False, "strict"),  # not a mode
])
def test_the_laptop_and_dl_run_refuse_bad_data_options_in_the_same_words(
        data, shard, mode) -> None:
    """dlc submit (data_argv) and dl-run (request_from_args) call the same rules
    (protocol.data_source.check_data_options): the laptop's usage error is dl-run's."""
    from bootstrap_scripts.jobs.engine.outcomes import EXIT_USAGE, RunError

    with pytest.raises(UsageError) as laptop:
        jobs.data_argv(data, shard, mode)
    opts = [*(("--data", data) if data else ()), *(("--data-shard",) if shard else ())]
    args = dl_run.build_parser().parse_args(opts)
    # dl-run's parser refuses a mode outside its choices itself (argparse's words, exit 2:
    # tests/data/test_plan_and_engine.py); past it, the rules are the shared ones
    args.data_checksums = mode
    with pytest.raises(RunError) as node:
        request_from_args(args, ["t"], "j1")
    assert str(laptop.value) == str(node.value) and str(node.value)
    assert node.value.code == EXIT_USAGE == errors.EXIT_USAGE
    assert (mode or data or "--data-shard") in str(node.value)


def test_submit_argv_passes_the_hang_timeout_through_the_document() -> None:
    argv = jobs.submit_argv(("true",), launcher=None, max_restarts=None, min_nodes=None,
                            name=None, hang_timeout=300.0)
    assert argv == ["dl-run", "--detach", "--json", "--hang-timeout", "300", "--", "true"]
    remote.document_parameters(argv, timeout=9)  # every word within the document's pattern


def test_scale_and_logs_argv() -> None:
    assert jobs.scale_argv(3, None) == ["dl-scale", "--workers", "3"]
    assert jobs.scale_argv(None, "10.0.1.9") == ["dl-scale", "--remove", "10.0.1.9"]
    replace = jobs.scale_argv(None, None, "10.0.1.7")
    assert replace == ["dl-scale", "--replace", "10.0.1.7"]
    remote.document_parameters(replace, timeout=9)  # within the operator document's pattern
    with pytest.raises(UsageError, match="exactly one"):
        jobs.scale_argv(None, "10.0.1.9", "10.0.1.7")
    status = jobs.scale_argv(None, None, status=True)
    assert status == ["dl-scale", "--status"]
    remote.document_parameters(status, timeout=9)
    with pytest.raises(UsageError, match="exactly one"):
        jobs.scale_argv(3, None, status=True)
    assert jobs.laptop_terms("watch with dl-scale --status") == "watch with dlc scale --status"
    assert jobs.page_argv("j1", "2:0=14", 2) == ["dl-jobs", "logs", "j1", "--cursor", "2:0=14",
                                                 "--node", "2"]
    remote.document_parameters(jobs.page_argv("j1", "2:0=14,1-ps=3,r=9", None), timeout=9)


def test_the_document_reads_from_an_offset_and_keeps_the_exit_status(tmp_path: Path) -> None:
    """How dlc logs reads long output in pieces: the document cuts them on the node."""
    text = "".join(f"line {i}\n" for i in range(100))
    src = tmp_path / "out.txt"
    src.write_text(text)
    got, offset = "", 0
    while True:
        params = remote.document_parameters(["dl-jobs", "logs", "j1"], timeout=60,
                                            offset=offset, limit=50)
        res = run_document_script(tmp_path, params, f"#!/bin/sh\ncat {src}\n")
        assert res.returncode == 0, res.stderr
        got += res.stdout.decode()
        offset += len(res.stdout)
        if len(res.stdout) < 50:
            break
    assert got == text
    params = remote.document_parameters(["dl-jobs", "x"], timeout=60, limit=50)
    failing = run_document_script(tmp_path, params, "#!/bin/sh\necho hi; exit 7\n")
    assert failing.returncode == 7 and failing.stdout == b"hi\n"


def test_arguments_reach_the_command_as_words_never_as_shell(tmp_path: Path) -> None:
    params = remote.document_parameters(["dl-jobs", "a=1", "--x", "b/c.py"], timeout=60)
    res = run_document_script(tmp_path, params,
                              '#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    assert res.stdout.decode() == "[a=1]\n[--x]\n[b/c.py]\n"
    # even a value SSM's patterns would refuse is only a word to the script
    res = run_document_script(tmp_path, {"command": "dl-jobs", "arguments": "$(id) * `id`"},
                              '#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    assert res.stdout.decode() == "[$(id)]\n[*]\n[`id`]\n"
    res = run_document_script(tmp_path, {"command": "id"}, "")
    assert res.returncode == 2 and b"not a cluster command" in res.stderr


def test_document_parameters_refuse_what_the_document_refuses() -> None:
    assert remote.document_parameters(["dl-run", "--detach", "--", "python", "-m", "m"],
                                      timeout=60, run_as="alice") == {
        "command": "dl-run", "arguments": "--detach -- python -m m",
        "executionTimeout": "60", "runAs": "alice"}
    for argv in (["bash"], ["dl-jobs", "a b"], ["dl-jobs", "x;y"], ["dl-jobs", ""],
                 ["dl-run", "--", "python", "-c", "print(1)"]):
        with pytest.raises(UsageError):
            remote.document_parameters(argv, timeout=60)
    for user in ("root", "Alice", "a b", ""):
        with pytest.raises(UsageError):
            remote.check_user(user)


def test_dlc_checks_with_the_documents_own_patterns() -> None:
    """dlc's client-side checks and the document's allowedPattern say the same."""
    params = document_content()["parameters"]
    assert remote.COMMANDS == COMMANDS
    assert params["arguments"]["allowedPattern"] == f"^[ {remote.ARGUMENT_CHARS}]*$"
    for word in ("--lr=0.1", "a/b.py", "x y", "$(id)", "a;b", "~", "#", "é"):
        ok = " " not in word and remote.ARGUMENT_RE.match(word) is not None
        assert ok == (re.search(params["arguments"]["allowedPattern"], word) is not None
                      and " " not in word), word
    for user in ("alice", "_svc", "a-b_1", "Alice", "1abc", "a" * 33):
        assert (remote.USER_RE.match(user) is not None) == \
            (re.search(params["runAs"]["allowedPattern"], user) is not None), user


@pytest.mark.parametrize(("arn", "user"), [
    ("arn:aws:sts::123456789012:assumed-role/Operators/alice", "alice"),
    ("arn:aws:sts::123456789012:assumed-role/Ops/Alice.Smith@example.com", "alice_smith"),
    ("arn:aws:iam::123456789012:user/team/bob", "bob"),
    ("arn:aws:sts::123456789012:federated-user/7carol", "_7carol"),
    ("arn:aws:iam::123456789012:root", "root"),
    ("arn:aws:sts::123456789012:assumed-role/R/" + "x" * 40, "x" * 32),
])
def test_user_from_the_callers_arn(arn: str, user: str) -> None:
    assert remote.user_from_arn(arn) == user


def test_submit_defaults_to_the_callers_user_and_never_root(monkeypatch) -> None:
    monkeypatch.setattr(jobs.aws, "caller_arn",
                        lambda target: "arn:aws:sts::1:assumed-role/Ops/dana@example.com")
    monkeypatch.setattr(jobs.aws, "principal_tag", lambda target, arn, key: None)
    assert jobs.job_user(None, None) == "dana"
    assert jobs.job_user(None, "erin") == "erin"
    monkeypatch.setattr(jobs.aws, "caller_arn", lambda target: "arn:aws:iam::1:root")
    with pytest.raises(UsageError, match="maps to the user root"):
        jobs.job_user(None, None)


def test_an_identity_without_a_user_still_runs_operator_commands(monkeypatch) -> None:
    """The account's root (maps to root) or a bad tag: dlc status etc. go through the
    any-user document (IAM decides); dlc submit says to give --as."""
    FakeAws().install(monkeypatch)
    monkeypatch.setattr(remote.aws, "caller_arn", lambda target: "arn:aws:iam::1:root")
    monkeypatch.setattr(remote.aws, "principal_tag", lambda target, arn, key: None)
    assert remote.Remote(None, "i-1").document == DOCS[0]
    monkeypatch.setattr(remote.aws, "principal_tag", lambda target, arn, key: "Not A User")
    with pytest.raises(UsageError, match="has the tag dl-user='Not A User'"):
        jobs.job_user(None, None)


def test_the_callers_dl_user_tag_names_their_user_before_the_arn(monkeypatch) -> None:
    asked = []
    monkeypatch.setattr(jobs.aws, "caller_arn",
                        lambda target: "arn:aws:sts::1:assumed-role/Ops/dana@example.com")
    monkeypatch.setattr(jobs.aws, "principal_tag",
                        lambda target, arn, key: asked.append(key) or "frank")
    assert jobs.job_user(None, None) == "frank" and asked == ["dl-user"]
    assert jobs.job_user(None, "erin") == "erin"  # --as picks the document to try


# -- which Command document dlc runs (constructs_lib/operator_document.py) ------------------

DOCS = ["DLClusterStack-OperatorAccessDocument1A2B3C-XyZ", "dl-op.DLClusterStack.alice",
        "dl-op.DLClusterStack.bob_2"]


def test_dlc_and_the_stack_name_per_user_documents_alike() -> None:
    from bootstrap_scripts.jobs.cli import dl_jobs
    from constructs_lib.operator_access import DEFAULT_USER_TAG
    from constructs_lib.operator_document import (
        OPERATOR_USER_ENV,
        USER_DOCUMENT_PREFIX,
        user_document_name,
    )

    assert (remote.USER_DOCUMENT_PREFIX, remote.USER_TAG) == (USER_DOCUMENT_PREFIX,
                                                               DEFAULT_USER_TAG)
    assert OPERATOR_USER_ENV == dl_jobs.OPERATOR_USER_ENV
    for cluster, user in (("DLClusterStack", "alice"), ("c-1", "_svc"), ("a_b", "x-y")):
        assert remote.document_user(user_document_name(cluster, user)) == user
    assert remote.document_user(DOCS[0]) is None


def test_dlc_picks_the_users_own_document_else_the_any_user_one() -> None:
    assert remote.choose_document(DOCS, "alice") == "dl-op.DLClusterStack.alice"
    assert remote.choose_document(DOCS, "bob_2") == "dl-op.DLClusterStack.bob_2"
    assert remote.choose_document(DOCS, "carol") == DOCS[0]  # IAM decides (admin policy)
    with pytest.raises(NotFound, match=r"no Command document for the cluster user carol "
                                       r"\(users with one: alice, bob_2"):
        remote.choose_document(DOCS[1:], "carol")


class FakeAws:
    """dlc.aws's calls a Remote makes, recorded; SendCommand refused when told to."""

    def __init__(self, refuse: str = "") -> None:
        self.sent: list[tuple[str, dict]] = []
        self.refuse = refuse

    def install(self, monkeypatch) -> None:
        monkeypatch.setattr(remote.aws, "operator_documents", lambda target: list(DOCS))
        monkeypatch.setattr(remote.aws, "send_command", self.send_command)
        monkeypatch.setattr(remote.aws, "command_invocation", lambda t, c, i: {
            "Status": "Success", "ResponseCode": 0, "StandardOutputContent": '{"job_id": "j-1"}'})

    def send_command(self, target, instance_id, document, params, **kwargs) -> str:
        if self.refuse:
            err = errors.AwsError(f"SendCommand {document} to {instance_id} failed: "
                                  f"{self.refuse}: not authorized")
            err.code = self.refuse
            raise err
        self.sent.append((document, params))
        return "cmd-1"


def test_submit_goes_through_the_users_own_document_without_run_as(monkeypatch) -> None:
    fake = FakeAws()
    fake.install(monkeypatch)
    master = remote.Remote(None, "i-1", poll=0, user="alice")
    assert jobs.submit(master, ["dl-run", "--detach", "--json", "--", "true"], "alice") == (
        "j-1", "")
    assert jobs.submit(master, ["dl-run", "--detach", "--json", "--", "true"], "carol") == (
        "j-1", "")
    jobs.cancel(master, "j-1")
    (doc_a, a), (doc_c, c), (doc_x, x) = fake.sent
    assert doc_a == "dl-op.DLClusterStack.alice" and "runAs" not in a  # not declared there
    assert doc_c == DOCS[0] and c["runAs"] == "carol"  # the any-user document's parameter
    assert doc_x == "dl-op.DLClusterStack.alice" and x["arguments"] == "cancel j-1"
    with pytest.raises(UsageError, match="runs jobs as alice only, not carol"):
        master.run(["dl-run", "--", "true"], run_as="carol")


@pytest.mark.parametrize(("user", "words"), [
    ("alice", ["dl-op.DLClusterStack.alice", "dl-user=alice", "OperatorPolicyArn"]),
    ("carol", ["any-user", "AdminSessionPolicyArn", "clusterUsers", "dl-user=carol"]),
    ("", ["any-user", "AdminSessionPolicyArn", "names no cluster user", "dl-user=<their"]),
])
def test_access_denied_names_the_user_and_the_tag_it_needs(monkeypatch, user, words) -> None:
    FakeAws(refuse="AccessDeniedException").install(monkeypatch)
    with pytest.raises(errors.AwsError) as exc:
        remote.Remote(None, "i-1", poll=0, user=user).run(["dl-health", "--json"])
    assert all(w in str(exc.value) for w in words), str(exc.value)
    assert exc.value.exit_code == errors.EXIT_AWS


# -- what the master answers ----------------------------------------------------------------

HEALTH = {"healthy": False, "generation": 4, "nodes": [
    {"rank": 0, "address": "10.0.1.5", "role": "master", "ok": True,
     "reachable": {"ok": True, "detail": "0.4s ago"}, "agent": {"ok": True, "detail": "1s ago"},
     "generation": {"ok": True, "detail": "4/4"}, "gpus": {"ok": True, "detail": "4"}},
    {"rank": 1, "address": "10.0.1.9", "role": "worker", "ok": False,
     "reachable": {"ok": False, "detail": "31.0s ago"}, "agent": {"ok": True, "detail": "2s"},
     "generation": {"ok": False, "detail": "3/4"}, "gpus": {"ok": False,
                                                          "detail": "2 (expected 4)"}}]}


def test_nodes_join_aws_and_the_master_on_the_address() -> None:
    from dlc.aws import Instance

    insts = [Instance("i-w", "worker", "g", "InService", "Healthy", "10.0.1.9", "g5.12xlarge",
                      "running"),
             Instance("i-m", "master", "g", "InService", "Healthy", "10.0.1.5", "g5.12xlarge",
                      "running"),
             Instance("i-new", "worker", "g", "Pending", "Healthy", "10.0.1.20", "g5.12xlarge",
                      "pending")]
    rows = status.merge_nodes(insts, HEALTH)
    assert [r["instance_id"] for r in rows] == ["i-m", "i-w", "i-new"]
    m, w, new = rows
    assert (m["rank"], m["healthy"], m["gpus"], m["generation_applied"]) == (0, True, 4, "4")
    assert (w["rank"], w["healthy"], w["gpus"], w["heartbeat_age_s"]) == (1, False, 2, 31.0)
    assert "reachable: 31.0s ago" in w["health"] and "generation: 3/4" in w["health"]
    assert (new["rank"], new["health"]) == (None, "not a member")


def test_member_without_instance_is_listed() -> None:
    rows = status.merge_nodes([], HEALTH)
    assert {r["address"] for r in rows} == {"10.0.1.5", "10.0.1.9"}
    assert all(r["lifecycle"] == "not in its group" for r in rows)


def test_status_shows_each_failed_launch_with_zone_type_and_cause() -> None:
    from rich.console import Console

    failed = {"role": "worker", "asg": "dl-workers", "zone": "us-east-1a",
              "instance_types": ["p5.48xlarge"], "decision": "move",
              "cause": "We currently do not have sufficient p5.48xlarge capacity"}
    st = {"stack": {"name": "DLClusterStack", "status": "CREATE_COMPLETE",
                    "region": "us-east-1"},
          "membership": {"generation": 2, "members": 2, "healthy": True},
          "nodes": status.merge_nodes([], HEALTH), "jobs": None, "errors": {},
          "launch_failures": [failed]}
    console = Console(record=True, width=200)
    status.render(console, st)
    text = console.export_text()
    assert "failed launches (1):" in text
    assert ("worker dl-workers: zone us-east-1a, p5.48xlarge: We currently do not have "
            "sufficient p5.48xlarge capacity (moved to the next zone)") in text


def test_jobs_list_accepts_both_shapes() -> None:
    assert status.jobs_list([{"job_id": "a"}]) == [{"job_id": "a"}]
    assert status.jobs_list({"jobs": [{"id": "b"}]}) == [{"id": "b"}]
    assert status.job_id({"id": "b"}) == "b"


# -- cost ---------------------------------------------------------------------------------

PRODUCT = json.dumps({"product": {"attributes": {"instanceType": "g5.xlarge"}}, "terms": {
    "OnDemand": {"X.JRTCKXETXF": {"priceDimensions": {"X.JRTCKXETXF.6YS6EN2CT7": {
        "unit": "Hrs", "pricePerUnit": {"USD": "1.0060000000"}}}}}}})


def test_on_demand_price_is_parsed() -> None:
    assert cost.parse_on_demand([PRODUCT]) == Decimal("1.006")
    assert cost.parse_on_demand(["{}", "not json"]) is None


def test_prices_are_cached_and_unknown_is_never_a_number(monkeypatch, tmp_path: Path) -> None:
    calls = []

    def products(target, instance_type, region):
        calls.append(instance_type)
        if instance_type == "p5.48xlarge":
            raise errors.AwsError("pricing GetProducts failed: AccessDeniedException")
        return [PRODUCT]

    monkeypatch.setattr(cost.aws, "on_demand_products", products)
    t = Target(region="us-east-1")
    est = cost.estimate(t, ["g5.xlarge", "g5.xlarge"], "us-east-1", cache=tmp_path)
    assert est["usd_per_hour"] == "2.012" and est["unknown"] == {}  # exact, no padding
    est = cost.estimate(t, ["g5.xlarge"], "us-east-1", cache=tmp_path)
    assert calls == ["g5.xlarge"], "the second estimate must come from the cache"
    mixed = cost.estimate(t, ["g5.xlarge", "p5.48xlarge"], "us-east-1", cache=tmp_path)
    assert mixed["usd_per_hour"] == "unknown"
    assert "AccessDenied" in mixed["unknown"]["p5.48xlarge"]
    assert cost.estimate(t, [], "us-east-1", cache=tmp_path)["usd_per_hour"] == "0"


@pytest.mark.parametrize(("value", "shown"), [
    ("1.0060000000", "1.006"), ("12.5", "12.50"), ("0", "0.00"), ("98.32", "98.32"),
    ("0.00041", "0.00"), ("3.0185", "3.018"), ("unknown", "unknown")])
def test_prices_read_as_money(value, shown):
    assert cost.usd(value) == shown


# -- sessions ------------------------------------------------------------------------------


def test_session_commands() -> None:
    t = Target(region="eu-west-1", profile="ops")
    assert session.connect_argv(t, "i-1") == [
        "aws", "ssm", "start-session", "--target", "i-1", "--region", "eu-west-1",
        "--profile", "ops"]
    argv = session.tunnel_argv(t, "i-1", 6006, 16006)
    assert argv[-4:] == ["--document-name", "AWS-StartPortForwardingSession", "--parameters",
                         '{"portNumber":["6006"],"localPortNumber":["16006"]}']


def test_missing_plugin_says_how_to_install_it(monkeypatch) -> None:
    monkeypatch.setattr(session.shutil, "which",
                        lambda name: None if name == session.PLUGIN else "/usr/bin/aws")
    with pytest.raises(errors.DlcError, match="session-manager-working-with-install-plugin"):
        session.check_tools()


def test_not_found_errors_exit_3() -> None:
    assert NotFound("x").exit_code == 3 and errors.AwsError("x").exit_code == 4


def test_no_credentials_says_what_to_do(monkeypatch, tmp_path: Path, capsys) -> None:
    """A new user with no AWS credentials at all gets the command that fixes it."""
    for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                 "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "DLC_EMULATOR", "AWS_ENDPOINT_URL"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # no instance role to fall back on
    code = main(["--region", "us-east-1", "status"])
    err = capsys.readouterr().err
    assert code == errors.EXIT_AWS, err
    assert "NoCredentialsError" in err and "aws configure" in err and "--profile" in err


@pytest.mark.parametrize(("code", "words"), [
    ("ExpiredToken", "session expired"), ("InvalidClientTokenId", "get-caller-identity"),
    ("AccessDenied", "OperatorPolicyArn")])
def test_aws_refusals_name_the_next_step(code: str, words: str) -> None:
    from botocore.exceptions import ClientError

    from dlc.aws import aws_error

    exc = ClientError({"Error": {"Code": code, "Message": "no"}}, "DescribeStacks")
    assert words in str(aws_error(exc, "cloudformation DescribeStacks"))


# -- cost per job ----------------------------------------------------------------------------


def test_submit_argv_carries_max_cost_exactly() -> None:
    argv = jobs.submit_argv(("true",), launcher=None, max_restarts=None, min_nodes=None,
                            name=None, max_cost="12.50")
    assert argv == ["dl-run", "--detach", "--json", "--max-cost", "12.5", "--", "true"]


@pytest.mark.parametrize("value", ["0", "-1", "ten", "0.001"])
def test_submit_refuses_a_bad_max_cost_naming_it(value) -> None:
    with pytest.raises(UsageError, match=r"--max-cost .*" + re.escape(repr(value))):
        jobs.submit_argv(("true",), launcher=None, max_restarts=None, min_nodes=None,
                         name=None, max_cost=value)


@pytest.mark.parametrize("job, cell", [
    ({"usage": [{}], "cost": {"usd": "1.709"}, "max_cost_usd": "5"}, "1.709/5"),
    ({"usage": [{}], "cost": {"usd": "2"}}, "2.00"),
    ({"usage": [{}], "cost": {"usd": "unknown"}}, "unknown"),
    ({"usage": [], "cost": {"usd": "0"}, "max_cost_usd": "5"}, "-/5"),
    ({"state": "queued"}, "-"),  # a master whose dl-jobs has no ledger
])
def test_the_jobs_cost_cell(job, cell) -> None:
    assert jobs.cost_cell(job) == cell


def test_dlc_jobs_shows_each_jobs_cost(monkeypatch, capsys) -> None:
    listing = [{"job_id": "a-1", "state": "budget", "world_size": 2, "full_size": 2,
                "restarts": 0, "submitted_at": 0, "usage": [{}], "cost": {"usd": "5.0001"},
                "max_cost_usd": "5", "message": "stopped at the cost cap"}]
    monkeypatch.setattr(jobs, "master_remote", lambda target: None)
    monkeypatch.setattr(jobs, "list_jobs", lambda remote: listing)
    monkeypatch.setattr("dlc.cli.target_of", lambda ctx: None)
    assert main(["jobs"]) == 0
    text = capsys.readouterr().out
    assert "cost USD" in text and "5.00/5" in text and "budget" in text


def test_dlc_jobs_fits_120_columns_and_its_json_cost_is_a_number(monkeypatch, capsys) -> None:
    ckpt = "/efs/checkpoints/alice/torchrun-20261207-192256-b3072e/step-000460/manifest.json"
    listing = [{"job_id": "torchrun-20261207-192256-b3072e", "state": "failed",
                "world_size": 3, "full_size": 3, "restarts": 2, "submitted_at": 1.8e9,
                "usage": [{}], "cost": {"usd": "0.012345678901234567890123456789"},
                "max_cost_usd": "5", "checkpoint": {"efs": ckpt, "s3": "s3://b/" + ckpt},
                "last_failure": "node rank 0 (127.20.128.5) exited with code 1: error: final "
                                "held-out accuracy 0.9222 is below --require-acc 0.95",
                "stragglers": ["127.20.128.6 (rank 1) 2.1x the median step"]}]
    monkeypatch.setattr(jobs, "master_remote", lambda target: None)
    monkeypatch.setattr(jobs, "list_jobs", lambda remote: listing)
    monkeypatch.setattr("dlc.cli.target_of", lambda ctx: None)
    assert main(["jobs"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert max(len(line) for line in lines) <= 120, "\n".join(lines)
    assert any("torchrun-20261207-192256-b3072e" in line for line in lines)
    assert main(["jobs", "--json"]) == 0
    (job,) = json.loads(capsys.readouterr().out)
    assert job["cost"]["usd"] == 0.012346 and job["max_cost_usd"] == "5"
    listing[0]["cost"] = {"usd": "unknown"}
    assert main(["jobs", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)[0]["cost"]["usd"] == "unknown"
    assert "budget" in status.FINISHED
