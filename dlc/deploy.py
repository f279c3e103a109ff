"""``dlc up`` and ``dlc down``: deploy and destroy the stack with the pinned CDK CLI.

The CLI is the repository's own (``npx --no-install cdk`` in the checkout, as ``make``
uses it; ``make setup`` installs it), so the template is exactly what ``make synth``
writes. While it runs, ``dlc`` shows what CloudFormation reports (stack events); after a
deploy it follows the cluster coming up: the groups' instances (Auto Scaling) reaching
InService, then the membership forming (``dl-health --json`` on the master). The CDK CLI's
own output goes to a log file, named on failure with its last lines.

``down`` deletes the stack. The shared file system is RETAINed by the stack (your data
outlives it), and so are the checkpoint bucket and its KMS key; ``--delete-data`` deletes
the file system and the checkpoint bucket (every version) afterwards and schedules the key's
deletion, but only what this stack created (never a file system it was given with
``efsFileSystemId``). The checkpoint bucket's access logs are kept (an audit trail).
"""

from __future__ import annotations

import datetime
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from dlc import aws, preflight, wake
from dlc.cost import cache_dir
from dlc.errors import DlcError, UsageError
from dlc.remote import Remote
from dlc.target import DEFAULT_STACK, Target

REPO_ROOT = Path(__file__).resolve().parent.parent
CDK_ENV = {"JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION": "18,20",
           "JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION": "1",
           "JSII_SILENCE_WARNING_UNTESTED_NODE_VERSION": "1",
           "CDK_DISABLE_VERSION_CHECK": "1", "CDK_CLI_NOTICES": "false", "CI": "true"}
#: How often stack events, instances and membership are polled (seconds).
POLL = 1.0
Echo = Callable[[str], None]


def context_pairs(pairs: tuple[str, ...] | list[str]) -> list[str]:
    """The ``key=value`` pairs as given; UsageError names a malformed one."""
    for pair in pairs:
        key, sep, _value = pair.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"-c expects key=value (a stack setting, docs/settings.md), "
                             f"got {pair!r}")
    return list(pairs)


def context_args(pairs: tuple[str, ...] | list[str]) -> list[str]:
    """``-c key=value`` pairs for the CDK CLI; UsageError names a malformed one."""
    return [a for pair in context_pairs(pairs) for a in ("-c", pair)]


def check_checkout(root: Path = REPO_ROOT) -> None:
    missing = [p for p in ("cdk.json", "node_modules/.bin/cdk") if not (root / p).exists()]
    if missing:
        raise DlcError(f"dlc up/down run the pinned CDK CLI from the repository checkout, and "
                       f"{root} lacks {', '.join(missing)}: run dlc from a clone after "
                       "make setup")


def _log_path(stack: str, what: str) -> Path:
    d = cache_dir() / "logs"
    d.mkdir(parents=True, exist_ok=True)
    stamp = datetime.datetime.now().strftime("%Y%m%d-%H%M%S")
    return d / f"cdk-{what}-{stack}-{stamp}.log"


def _out_dir(stack: str) -> Path:
    """dlc's own cloud assembly directory: a deploy never races another synth's cdk.out."""
    return cache_dir() / "cdk.out" / stack


def _tail(path: Path, lines: int = 20) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


class EventPrinter:
    """Prints each new CloudFormation resource event once: ``STATUS  TYPE  LOGICAL-ID``."""

    def __init__(self, target: Target, echo: Echo, seen: set[str] | None = None) -> None:
        self.target = target
        self.echo = echo
        self.seen = seen or set()
        self.stack_id = ""
        self.completed = 0

    def poll(self) -> None:
        if not self.stack_id:
            stack = aws.stack_exists(self.target)
            if stack is None:
                return
            self.stack_id = stack.stack_id or stack.name
        try:
            events = aws.stack_events(self.target, self.stack_id, self.seen)
        except DlcError:
            return  # the stack is gone (a delete finished): nothing more to show
        for ev in events:
            if ev["EventId"] in self.seen:
                continue
            self.seen.add(ev["EventId"])
            status = ev.get("ResourceStatus", "")
            if ev.get("ResourceType") == "AWS::CloudFormation::Stack" or \
                    status.endswith(("COMPLETE", "FAILED", "SKIPPED")):
                if status in ("CREATE_COMPLETE", "DELETE_COMPLETE", "UPDATE_COMPLETE") and \
                        ev.get("ResourceType") != "AWS::CloudFormation::Stack":
                    self.completed += 1
                reason = ev.get("ResourceStatusReason") or ""
                self.echo(f"  {status:<20} {ev.get('ResourceType', ''):<40} "
                          f"{ev.get('LogicalResourceId', '')}"
                          + (f"  ({reason})" if "FAILED" in status and reason else ""))


def run_cdk(target: Target, args: list[str], what: str, events: EventPrinter,
            timeout: float) -> Path:
    """``npx cdk <args>`` with stack events shown while it runs; DlcError with the log's
    tail when it fails."""
    check_checkout()
    log = _log_path(target.stack, what)
    env = {**target.cli_env(), **CDK_ENV}
    with open(log, "wb") as fh:
        proc = subprocess.Popen(["npx", "--no-install", "cdk", *args], cwd=REPO_ROOT, env=env,
                                stdout=fh, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                start_new_session=True)
        deadline = time.monotonic() + timeout
        try:
            while proc.poll() is None:
                events.poll()
                if time.monotonic() > deadline:
                    proc.kill()
                    raise DlcError(f"cdk {what} took longer than {timeout:.0f} s; stopped "
                                   f"(log: {log})")
                time.sleep(POLL)
        except BaseException:
            if proc.poll() is None:
                proc.kill()
            proc.wait()
            raise
    events.poll()
    if proc.returncode != 0:
        raise DlcError(f"cdk {what} failed with exit status {proc.returncode} (log: {log}):"
                       f"\n{_tail(log)}")
    return log


def up(target: Target, contexts: list[str], echo: Echo, *, wait: bool = True,
       timeout: float = 1800) -> dict:
    """Check the settings against the account (``dlc.preflight``), deploy, then follow nodes
    and membership until the cluster is formed."""
    if target.stack == DEFAULT_STACK:
        preflight.check(target, context_pairs(contexts), echo)
    args = ["deploy", target.stack, "--require-approval", "never", "--progress", "events",
            "--output", str(_out_dir(target.stack)), *context_args(contexts)]
    before = aws.stack_exists(target)
    seen = {e["EventId"] for e in aws.stack_events(target, before.stack_id)} if before else set()
    events = EventPrinter(target, echo, seen)
    echo(f"deploying {target.stack} to {target.region} with the CDK CLI "
         f"({'update' if before else 'new stack'}); CloudFormation events:")
    t0 = time.monotonic()
    run_cdk(target, args, "deploy", events, timeout)
    stack = aws.describe_stack(target)
    echo(f"stack {stack.name}: {stack.status}, {events.completed} resource(s) created or "
         f"updated in {time.monotonic() - t0:.0f} s")
    summary = {"stack": stack.name, "status": stack.status, "outputs": stack.outputs}
    if before:  # an update: a master the idle stop stopped starts again (dlc/wake.py)
        master = wake.master_group(target, stack)
        summary["woken"] = wake.is_stopped(master)
        if summary["woken"]:
            wake.start(target, master, echo)
    if wait:
        summary["nodes"] = wait_nodes(target, stack, echo, t0 + timeout)
        summary["membership"] = wait_membership(target, stack, echo, t0 + timeout)
    for key in ("OperatorPolicyArn", "FileSystemId", "ConnectCommand"):
        if stack.outputs.get(key):
            echo(f"  {key}: {stack.outputs[key]}")
    return summary


def wait_nodes(target: Target, stack: aws.Stack, echo: Echo, deadline: float) -> list[dict]:
    """Until every group has its desired capacity InService (Auto Scaling's view)."""
    last = ""
    while True:
        groups = aws.groups(target, stack)
        want = sum(int(g.get("DesiredCapacity", 0)) for g in groups.values())
        nodes = aws.instances(target, stack)
        ready = [n for n in nodes if n.lifecycle == "InService"]
        line = (f"nodes: {len(ready)}/{want} InService ("
                + ", ".join(f"{n.role} {n.instance_id} {n.lifecycle}" for n in nodes) + ")")
        if line != last:
            echo(line)
            last = line
        if len(ready) >= want:
            return [n.to_dict() for n in nodes]
        if time.monotonic() > deadline:
            raise DlcError(f"only {len(ready)} of {want} instances InService before the "
                           "timeout; see the groups' scaling activities in the console")
        time.sleep(POLL)


def wait_membership(target: Target, stack: aws.Stack, echo: Echo, deadline: float) -> dict:
    """Until the master's ``dl-health`` lists every InService instance, all healthy."""
    last = ""
    while True:
        nodes = [n for n in aws.instances(target, stack) if n.lifecycle == "InService"]
        master = aws.master_instance(target, stack, nodes)
        try:
            health = Remote(target, master.instance_id).json(["dl-health", "--json"],
                                                             allow_codes=(0, 1))
        except DlcError as exc:
            health, why = {}, str(exc)
        else:
            why = ""
        members = {m.get("address") for m in (health or {}).get("nodes", [])}
        want = {n.address for n in nodes}
        line = (f"membership: generation {health.get('generation', '-')}, "
                f"{len(members & want)}/{len(want)} node(s) in it"
                + (", all healthy" if health.get("healthy") else "")
                + (f" (master not answering yet: {why})" if why else ""))
        if line != last:
            echo(line)
            last = line
        if health.get("healthy") and want <= members:
            return {"generation": health.get("generation"), "members": sorted(members)}
        if time.monotonic() > deadline:
            raise DlcError(f"the membership did not form before the timeout: {line}")
        time.sleep(POLL)


def checkpoint_storage(target: Target, stack) -> tuple[str, str]:
    """(bucket, key id) of the checkpoint bucket and key this stack created ("" if not)."""
    bucket = stack.outputs.get(aws.CHECKPOINT_BUCKET_OUTPUT, "")
    owned_bucket = key = ""
    for r in aws.stack_resources(target):
        if r.get("ResourceType") == "AWS::S3::Bucket" and r.get("PhysicalResourceId") == bucket:
            owned_bucket = bucket
        if r.get("ResourceType") == "AWS::KMS::Key" and "CheckpointKey" in r.get(
                "LogicalResourceId", ""):
            key = r.get("PhysicalResourceId", "")
    return owned_bucket, key


def checkpoint_bucket_down(target: Target, echo: Echo, retained: tuple[str, str],
                           delete_data: bool) -> dict:
    """After the stack is gone: keep the checkpoint bucket, or (``--delete-data``) empty
    and delete it and schedule its key's deletion."""
    bucket, key = retained
    if not bucket:
        return {"checkpoint_bucket": None, "checkpoint_bucket_deleted": False}
    if not delete_data:
        echo(f"kept checkpoint bucket {bucket} (the stack RETAINs it, and its KMS key); "
             f"dlc down --delete-data next time deletes both")
        return {"checkpoint_bucket": bucket, "checkpoint_bucket_deleted": False}
    versions = aws.delete_bucket(target, bucket)
    echo(f"deleted checkpoint bucket {bucket} ({versions} object version(s), --delete-data)")
    if key:
        aws.schedule_key_deletion(target, key)
        echo(f"scheduled KMS key {key} for deletion in 7 days (cancel with aws kms "
             f"cancel-key-deletion --key-id {key})")
    return {"checkpoint_bucket": bucket, "checkpoint_bucket_deleted": True}


def down(target: Target, echo: Echo, *, delete_data: bool = False,
         timeout: float = 1800) -> dict:
    """Destroy the stack; keep (or with ``delete_data`` delete) its file system."""
    stack = aws.describe_stack(target)
    fs = stack.outputs.get(aws.FILE_SYSTEM_OUTPUT, "")
    owned = any(r.get("ResourceType") == "AWS::EFS::FileSystem"
                and r.get("PhysicalResourceId") == fs for r in aws.stack_resources(target))
    retained = checkpoint_storage(target, stack)
    seen = {e["EventId"] for e in aws.stack_events(target, stack.stack_id)}
    events = EventPrinter(target, echo, seen)
    events.stack_id = stack.stack_id or stack.name
    echo(f"destroying {stack.name} in {target.region}; CloudFormation events:")
    run_cdk(target, ["destroy", target.stack, "--force", "--output",
                     str(_out_dir(target.stack))], "destroy", events, timeout)
    if aws.stack_exists(target) is not None:
        raise DlcError(f"cdk destroy ended but stack {stack.name} still exists")
    result = {"stack": stack.name, "deleted": True, "file_system": fs or None,
              "file_system_deleted": False}
    echo(f"stack {stack.name} deleted")
    result.update(checkpoint_bucket_down(target, echo, retained, delete_data))
    if not fs:
        return result
    if not delete_data:
        echo(f"kept EFS {fs} (the stack RETAINs it: your data and checkpoints are still "
             f"there); to delete it: aws efs delete-file-system --file-system-id {fs} "
             f"--region {target.region}, or dlc down --delete-data next time")
    elif not owned:
        echo(f"kept EFS {fs}: the stack did not create it (efsFileSystemId), so "
             "--delete-data leaves it alone")
    else:
        aws.delete_file_system(target, fs)
        result["file_system_deleted"] = True
        echo(f"deleted EFS {fs} (--delete-data): its data is gone")
    return result
