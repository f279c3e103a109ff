"""``dl-submit``: run a training job on a running EMR deep-learning cluster, as an EMR step.

    dl-submit --emr j-1ABCDEFGHIJK -- python train.py --epochs 20
    dl-submit --emr j-1ABCDEFGHIJK --wait -- --launcher horovod -- python train.py

Adds one step (``add-job-flow-steps``) whose ``command-runner.jar`` runs ``dl-run`` on the
primary node with everything after ``--`` (dl-run's own options may come first, as in
``dl-run [options] -- <command>``), prints the step id, and with ``--wait`` follows the
step's state until it ends: exit 0 when it COMPLETED, 1 when it FAILED / was CANCELLED /
INTERRUPTED (with EMR's failure reason and the log location).

The step definition comes from :func:`dl_run_step`, which the CDK construct also uses for
the optional deploy-time step: a step submitted later is the same as one given at deploy.
"""

from __future__ import annotations

import argparse
import shlex
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

COMMAND_RUNNER = "command-runner.jar"
DL_RUN = "dl-run"
#: Where bootstrap_scripts.emr.services installs the wrapper; absolute, so the step does not
#: depend on the PATH that command-runner.jar gives the hadoop user.
DL_RUN_PATH = "/usr/local/bin/dl-run"
TERMINAL_STATES = ("COMPLETED", "CANCELLED", "FAILED", "INTERRUPTED")
ACTIONS_ON_FAILURE = ("CONTINUE", "CANCEL_AND_WAIT", "TERMINATE_CLUSTER")
MAX_STEP_NAME = 256

EXIT_OK = 0
EXIT_STEP_FAILED = 1
EXIT_USAGE = 2
EXIT_TIMEOUT = 3


class SubmitError(Exception):
    """Submitting or following the step failed; ``code`` is the exit status."""

    def __init__(self, message: str, code: int = EXIT_STEP_FAILED):
        super().__init__(message)
        self.code = code


def dl_run_step(command: Sequence[str], *, name: str = "",
                action_on_failure: str = "CONTINUE") -> dict[str, Any]:
    """The EMR step (API shape) that runs ``dl-run <command>`` on the primary node.

    CONTINUE by default: a failed training run must not terminate (and bill a restart of)
    the whole cluster.
    """
    args = [str(a) for a in command]
    if not args:
        raise SubmitError("no training command given (put it after '--')", EXIT_USAGE)
    if action_on_failure not in ACTIONS_ON_FAILURE:
        raise SubmitError(f"--action-on-failure must be one of {', '.join(ACTIONS_ON_FAILURE)}, "
                          f"got {action_on_failure!r}", EXIT_USAGE)
    title = name or f"{DL_RUN} {shlex.join(args)}"
    return {
        "Name": title[:MAX_STEP_NAME],
        "ActionOnFailure": action_on_failure,
        "HadoopJarStep": {"Jar": COMMAND_RUNNER, "Args": [DL_RUN_PATH, *args]},
    }


def submit(emr: Any, cluster_id: str, step: dict[str, Any]) -> str:
    """Add ``step`` to the cluster; return its id."""
    response = emr.add_job_flow_steps(JobFlowId=cluster_id, Steps=[step])
    return response["StepIds"][0]


def wait_for_step(emr: Any, cluster_id: str, step_id: str, *, poll: float = 15.0,
                  timeout: float | None = None, say: Callable[[str], None] = print,
                  sleep: Callable[[float], None] = time.sleep,
                  clock: Callable[[], float] = time.monotonic) -> dict[str, Any]:
    """Follow the step until a terminal state; print each state change; return its Status."""
    deadline = None if timeout is None else clock() + timeout
    last = None
    while True:
        status = emr.describe_step(ClusterId=cluster_id, StepId=step_id)["Step"]["Status"]
        state = status["State"]
        if state != last:
            say(f"{step_id} {state}")
            last = state
        if state in TERMINAL_STATES:
            return status
        if deadline is not None and clock() >= deadline:
            raise SubmitError(f"step {step_id} still {state} after {timeout:.0f}s "
                              "(it keeps running; follow it with aws emr describe-step)",
                              EXIT_TIMEOUT)
        sleep(poll)


def failure_message(cluster_id: str, step_id: str, status: dict[str, Any]) -> str:
    details = status.get("FailureDetails") or {}
    reason = details.get("Reason") or status.get("StateChangeReason", {}).get("Message") or ""
    parts = [f"step {step_id} on {cluster_id} ended {status['State']}"]
    if reason:
        parts.append(f"reason: {reason}")
    if details.get("Message"):
        parts.append(details["Message"])
    if details.get("LogFile"):
        parts.append(f"log: {details['LogFile']}")
    return "; ".join(parts)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="dl-submit", usage="dl-submit --emr <cluster-id> [options] -- <training command>",
        description=__doc__.split("\n\n")[0])
    p.add_argument("--emr", required=True, metavar="CLUSTER_ID",
                   help="id of the running EMR cluster (j-...)")
    p.add_argument("--wait", action="store_true",
                   help="wait for the step to end; exit 0 only if it COMPLETED")
    p.add_argument("--name", default="", help="step name (default: the command)")
    p.add_argument("--action-on-failure", default="CONTINUE", choices=ACTIONS_ON_FAILURE)
    p.add_argument("--region", default=None, help="AWS region (default: your AWS config)")
    p.add_argument("--poll", type=float, default=15.0, help="seconds between state checks")
    p.add_argument("--timeout", type=float, default=None,
                   help="give up waiting after this many seconds (exit 3; the step goes on)")
    return p


def main(argv: list[str] | None = None, *, client: Any = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if "--" in argv:
        i = argv.index("--")
        own, command = argv[:i], argv[i + 1:]
    else:
        own, command = argv, []
    args = build_parser().parse_args(own)
    try:
        if not args.emr.startswith("j-"):
            raise SubmitError(f"--emr must be an EMR cluster id like j-1ABCDEFGHIJK, "
                              f"got {args.emr!r}", EXIT_USAGE)
        step = dl_run_step(command, name=args.name, action_on_failure=args.action_on_failure)
        if client is None:
            import boto3

            client = boto3.client("emr", region_name=args.region)
        step_id = submit(client, args.emr, step)
        print(step_id, flush=True)
        if not args.wait:
            return EXIT_OK
        status = wait_for_step(client, args.emr, step_id, poll=args.poll, timeout=args.timeout,
                               say=lambda m: print(m, file=sys.stderr, flush=True))
        if status["State"] == "COMPLETED":
            return EXIT_OK
        raise SubmitError(failure_message(args.emr, step_id, status))
    except SubmitError as exc:
        print(f"dl-submit: {exc}", file=sys.stderr)
        return exc.code
    except Exception as exc:  # botocore ClientError / NoCredentialsError / endpoint errors
        if type(exc).__module__.split(".")[0] not in ("botocore", "boto3"):
            raise
        print(f"dl-submit: EMR request for cluster {args.emr} failed: {exc}", file=sys.stderr)
        return EXIT_STEP_FAILED


if __name__ == "__main__":
    sys.exit(main())
