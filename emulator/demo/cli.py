"""The demo's options: parsing, and validation before anything starts.

Bad input stops here with argparse's exit status 2 and a message naming the option, so a
typo never costs a deploy.
"""

from __future__ import annotations

import argparse

#: The usage line every error follows: what the user typed, not the module behind it.
USAGE = 'make demo ARGS="[OPTION ...]"   (all options: make demo ARGS="--help")'


def build_parser() -> argparse.ArgumentParser:
    # Users start the demo through make, so usage and errors speak in make's terms; the
    # epilog says how to run it without make (what tests and --stop lines do).
    p = argparse.ArgumentParser(
        prog="make demo",
        usage=USAGE,
        description="Deploy the cluster to a local AWS emulator (moto) with the real CDK CLI, "
                    "boot one emulated node per instance and train across them.",
        epilog="Without make (same options): .venv/bin/python -m emulator.demo [OPTION ...]")
    p.add_argument("--workers", type=int, default=2, help="worker count (default: 2)")
    p.add_argument("--fail-launches", type=int, default=0, metavar="K",
                   help="K worker launches fail as on AWS (default: 0)")
    p.add_argument("--kill-node-after", type=float, default=None, metavar="SECONDS",
                   help="kill one worker's machine this many seconds after the job's first "
                        "epoch (0: at once); the job controller has it replaced and resumes "
                        "the job from its checkpoint at full size, under the same dl-run; "
                        "with --elastic the job trains on the survivors at once and the "
                        "replacement joins it")
    p.add_argument("--kill-master-after", type=float, default=None, metavar="SECONDS",
                   help="kill the master's machine (and the dl-run following the job there) "
                        "this many seconds after the first epoch; Auto Scaling replaces it, "
                        "the new master takes over, the demo re-attaches with dl-jobs logs -f")
    p.add_argument("--unhealthy-node", action="store_true",
                   help="one worker boots with a failing GPU driver: the health gate fails "
                        "it and it is replaced before the job starts")
    p.add_argument("--elastic", action="store_true",
                   help="run the job elastic (dl-run --elastic): workers may join and leave")
    p.add_argument("--add-worker-after", type=float, default=None, metavar="SECONDS",
                   help="elastic: this many seconds after the first epoch, raise the worker "
                        "group's desired capacity by one (as dl-scale does) and boot the node")
    p.add_argument("--remove-worker-after", type=float, default=None, metavar="SECONDS",
                   help="elastic: this many seconds after the added worker joined, remove it "
                        "through the drain lifecycle hook (master and base workers are "
                        "protected)")
    p.add_argument("--data-prep", default="", metavar="COMMAND",
                   help="data-preparation command every node runs before joining "
                        "(-c dataPrepScript=...)")
    p.add_argument("--data", action="store_true",
                   help="the dataset comes from S3: upload the digits to an emulated data "
                        "bucket (-c dataBucket=...), stage it on every node with dl-run "
                        "--data and train from the staged copy (emulator/demo/data.py)")
    p.add_argument("--fail-data-prep", action="store_true",
                   help="the added worker's data preparation fails: it must never join")
    p.add_argument("--epochs", type=int, default=None,
                   help="training epochs (default: 20, or with --add-worker-after as many as "
                        "the scenario needs while the job trains)")
    p.add_argument("--require-acc", type=float, default=None,
                   help="held-out accuracy the job must reach (default: 0.95, the example's "
                        "target; 0.80 with --epochs below 10, said before starting)")
    p.add_argument("--framework", choices=("torch", "tf"), default="torch",
                   help="the example job: torch (PyTorch DDP, torchrun; default) or tf "
                        "(TensorFlow MultiWorkerMirroredStrategy, dl-run --launcher tf; first "
                        "installs tensorflow-cpu 2.21.0 into .venv, about 1.3 GB)")
    p.add_argument("--scheduler", choices=("native", "slurm"), default="native",
                   help="the cluster's scheduler (-c scheduler=...): native (dl-run and the "
                        "job controller; default) or slurm (a real user submits the DDP "
                        "recipe with sbatch; docs/demo.md)")
    p.add_argument("--keep", action="store_true",
                   help="leave the emulated cluster running and print how to use and stop it")
    p.add_argument("--report", default="demo-report.json", help="report path "
                   "(default: demo-report.json)")
    p.add_argument("--port", type=int, default=0, help="moto's port on localhost "
                   "(default: a free one)")
    p.add_argument("--work-dir", default="", help="where node roots, EFS and logs go "
                   "(default: a temp dir, removed at the end unless --keep; a directory given "
                   "here is kept)")
    p.add_argument("--membership-timeout", type=float, default=120.0,
                   help="seconds to wait for all nodes to agree (default: 120)")
    p.add_argument("--stop", metavar="STATE_FILE", default="",
                   help="stop a cluster left running by --keep (or what a failed run left) and "
                        "remove its temp dir, after listing what that deletes (EFS job logs, "
                        "checkpoints, node roots, logs)")
    p.add_argument("--keep-files", action="store_true",
                   help="with --stop: stop the processes but keep the work directory")
    p.add_argument("--capacity-out", action="append", default=[], metavar="TYPE[@ZONE]",
                   help="EC2 has no capacity for this instance type (in this zone); "
                        "repeatable (emulator/demo/capacity.py)")
    p.add_argument("--flaky-launches", type=int, default=0, metavar="N",
                   help="the first N worker launches fail with InsufficientInstanceCapacity, "
                        "then capacity frees: the group retries and the cluster forms at full "
                        "size (default: 0; emulator/capacity.py)")
    p.add_argument("--boot-delay", type=float, default=0.0, metavar="SECONDS",
                   help="each node's OS boot before its user data runs, as a Deep Learning "
                        "AMI takes minutes (e.g. 180); the first nodes boot in parallel "
                        "(default: 0; emulator/nodes.py)")
    p.add_argument("--enforce-iam", action="store_true",
                   help="after the deploy, moto checks every call against the caller's IAM "
                        "policies: nodes, jobs and Lambda calls are held to the stack's roles "
                        "(emulator/iam_enforcement.py; what moto evaluates: docs/emulator.md)")
    p.add_argument("--context", action="append", default=[], metavar="KEY=VALUE",
                   help="a stack setting for cdk deploy (-c KEY=VALUE); repeatable")
    return p


def validate(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """Reject combinations the demo cannot play (exits 2 through ``parser.error``)."""
    if ns.keep_files and not ns.stop:
        parser.error("--keep-files only goes with --stop STATE_FILE")
    if ns.stop:
        return
    from emulator.demo.capacity import validate as validate_capacity
    from emulator.demo.scenarios import job_epochs, require_acc

    validate_capacity(ns, parser)

    if ns.epochs is not None and ns.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {ns.epochs}")
    ns.epochs_sized = ns.elastic and ns.epochs is None  # the job then ends when told to
    ns.epochs, why = job_epochs(ns)
    if why:
        parser.error(why)
    if ns.workers < 1:
        parser.error(f"--workers must be at least 1, got {ns.workers}")
    if ns.workers > 32:
        parser.error(f"--workers {ns.workers} is more than this emulator runs on one "
                     f"machine (32 at most)")
    if ns.fail_launches < 0:
        parser.error(f"--fail-launches must be >= 0, got {ns.fail_launches}")
    if ns.flaky_launches < 0:
        parser.error(f"--flaky-launches must be >= 0, got {ns.flaky_launches}")
    if ns.flaky_launches and ns.fail_launches:
        parser.error("--flaky-launches (launches fail, then the retries succeed) and "
                     "--fail-launches (launches fail for good) are separate drills; pick one")
    if ns.fail_launches > ns.workers:
        parser.error(f"--fail-launches {ns.fail_launches} is more than --workers "
                     f"{ns.workers}: at most {ns.workers} worker launches can fail")
    if ns.kill_node_after is not None:
        if ns.kill_node_after < 0:
            parser.error(f"--kill-node-after must be >= 0 seconds, got {ns.kill_node_after}")
        if ns.workers - ns.fail_launches < 1:
            parser.error("--kill-node-after needs at least one running worker to kill "
                         f"(--workers {ns.workers}, --fail-launches {ns.fail_launches})")
    if ns.kill_master_after is not None and ns.kill_master_after < 0:
        parser.error(f"--kill-master-after must be >= 0 seconds, got {ns.kill_master_after}")
    if ns.kill_master_after is not None and ns.kill_node_after is not None:
        parser.error("--kill-node-after and --kill-master-after are separate drills; pick one")
    if ns.unhealthy_node and ns.workers - ns.fail_launches < 1:
        parser.error("--unhealthy-node needs at least one running worker")
    for name in ("kill_node_after", "kill_master_after"):
        if ns.epochs < 2 and getattr(ns, name) is not None:
            parser.error(f"--{name.replace('_', '-')} needs --epochs >= 2 (a checkpoint to "
                         f"resume from), got {ns.epochs}")
    if (ns.add_worker_after is not None or ns.remove_worker_after is not None) and \
            not ns.elastic:
        parser.error("--add-worker-after / --remove-worker-after need --elastic")
    if ns.remove_worker_after is not None and ns.add_worker_after is None:
        parser.error("--remove-worker-after needs --add-worker-after: the master and the base "
                     "workers are protected from scale-in, only an added worker can leave")
    if ns.fail_data_prep and ns.add_worker_after is None:
        parser.error("--fail-data-prep needs --add-worker-after (the added node's hook fails)")
    for name in ("add_worker_after", "remove_worker_after"):
        if getattr(ns, name) is not None and getattr(ns, name) < 0:
            parser.error(f"--{name.replace('_', '-')} must be >= 0, got {getattr(ns, name)}")
    if ns.elastic and (ns.kill_master_after is not None or ns.unhealthy_node):
        parser.error("--kill-master-after / --unhealthy-node and --elastic are separate "
                     "scenarios; pick one (--elastic --kill-node-after trains on the survivors)")
    if ns.kill_node_after is not None and ns.add_worker_after is not None:
        parser.error("--kill-node-after and --add-worker-after are separate scenarios; "
                     "pick one")
    if ns.framework == "tf" and (ns.elastic or ns.unhealthy_node or ns.kill_node_after
                                 is not None or ns.kill_master_after is not None):
        parser.error("--framework tf runs the plain job only: --elastic, --kill-node-after, "
                     "--kill-master-after and --unhealthy-node resume the PyTorch example "
                     "from its checkpoints")
    if ns.data and (ns.elastic or ns.framework == "tf"):
        parser.error("--data stages the dataset for the PyTorch example's plain or recovery "
                     "runs: not with --elastic (joining nodes would not have it) or "
                     "--framework tf")
    if ns.scheduler == "slurm" and (
            ns.elastic or ns.unhealthy_node or ns.data or ns.framework == "tf"
            or ns.kill_node_after is not None or ns.kill_master_after is not None):
        parser.error("--scheduler slurm runs the plain job (the sbatch recipe): not with "
                     "--elastic, --kill-node-after, --kill-master-after, --unhealthy-node, "
                     "--data or --framework tf, which play dl-run's job controller")
    if ns.epochs < 1:
        parser.error(f"--epochs must be >= 1, got {ns.epochs}")
    if ns.require_acc is not None and not 0 <= ns.require_acc <= 1:
        parser.error(f"--require-acc must be within 0..1, got {ns.require_acc}")
    ns.require_acc, ns.acc_note = require_acc(ns)
    check_stack_settings(ns, parser)


def check_stack_settings(ns: argparse.Namespace, parser: argparse.ArgumentParser) -> None:
    """The stack settings the deploy will pass (``--context``, ``--workers`` and what the
    scenario adds), checked as ``cdk synth`` checks them (stacks/settings.py: an unknown key
    with the closest known one, a value out of its bounds), before anything starts."""
    from constructs_lib.validation import ConfigError
    from emulator.demo import capacity, scenarios
    from emulator.demo import data as demo_data
    from stacks.context import refuse_unknown_keys
    from stacks.emr_stack import EMR_CONTEXT_KEYS
    from stacks.settings import CONTEXT_KEYS, settings_from_context

    context = {"workerCount": str(ns.workers), **scenarios.deploy_context(ns),
               **capacity.stack_context(ns), **demo_data.deploy_context(ns)}
    try:
        refuse_unknown_keys(context, {*CONTEXT_KEYS, *EMR_CONTEXT_KEYS})
        settings_from_context(context.get)
    except ConfigError as exc:
        parser.error(f"--context: {exc}")
    if ns.port and not 1024 <= ns.port <= 65535:
        parser.error(f"--port must be 1024..65535, got {ns.port}")


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    from emulator.demo.orchestration import Demo, stop_from_state

    parser = build_parser()
    ns = parser.parse_args(argv)
    validate(ns, parser)
    from emulator.demo.signals import safe_stdout

    console = Console(file=safe_stdout(), highlight=False, soft_wrap=True)
    if ns.stop:
        return stop_from_state(ns.stop, console, keep_files=ns.keep_files)
    if ns.keep:  # the kept cluster's Auto Scaling and EC2 go on in the background
        from emulator.demo import keeper

        keeper.detach()
        demo = Demo(ns, console)
        keeper.record(demo)  # in state.json from the first save: --stop can always stop it
        return keeper.serve(demo, demo.run())
    return Demo(ns, console).run()
