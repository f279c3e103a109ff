"""``make demo ARGS="--data"``: the job reads its dataset from S3, staged on every node.

Before the deploy the demo does what a user does once: puts the dataset in a bucket of
theirs (scikit-learn's digits as ``digits.npz``, in the emulated account's
``dl-demo-datasets``) and deploys with ``-c dataBucket=… -c dataPrefix=digits/``. The job
then runs with ``dl-run --data s3://dl-demo-datasets/digits/``: every node's executor stages
the prefix onto the node's local disk as the job's user before the job starts, and the
example trains from that copy (``train_digits --data-dir``, which defaults to the
``DL_DATA_DIR`` every rank gets). After the job the demo checks the job's ``staging.json``,
each node's staged file and that every rank said it read it.
"""

from __future__ import annotations

import io
import json
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from emulator.demo.context import DemoContext

BUCKET = "dl-demo-datasets"
PREFIX = "digits/"
SOURCE = f"s3://{BUCKET}/{PREFIX}"


def deploy_context(ns) -> dict[str, str]:
    return {"dataBucket": BUCKET, "dataPrefix": PREFIX} if ns.data else {}


def dl_run_args(ns) -> list[str]:
    return ["--data", SOURCE] if ns.data else []


def upload(ctx: DemoContext) -> None:
    """The user's dataset in the user's bucket (before the cluster exists)."""
    import numpy as np
    from sklearn.datasets import load_digits

    ctx.step(f"putting the digits dataset in {SOURCE} (your data bucket, before the cluster)")
    x, y = load_digits(return_X_y=True)
    buf = io.BytesIO()
    np.savez(buf, x=x, y=y)
    s3 = ctx.session().client("s3", endpoint_url=ctx.endpoint)
    s3.create_bucket(Bucket=BUCKET)
    s3.put_object(Bucket=BUCKET, Key=f"{PREFIX}digits.npz", Body=buf.getvalue())
    ctx.ok(f"{SOURCE}digits.npz: {len(buf.getvalue())} bytes, {len(y)} samples")


def check(ctx: DemoContext, job_id: str) -> None:
    """Every node staged the data and every rank trained from its node's copy; DemoError
    (the job's files named) otherwise."""
    from emulator.demo.context import DemoError

    jobs = sorted(ctx.efs.joinpath("jobs").glob(f"*/{job_id}*/staging.json"))  # <user>/<id>
    if not jobs:
        raise DemoError(f"--data: no staging.json under {ctx.efs / 'jobs'} for job {job_id}")
    report = json.loads(jobs[-1].read_text())
    logs = jobs[-1].parent / "nodes"
    for node in report["nodes"]:
        staged = f"{node['directory']}/digits.npz"
        with open(staged, "rb") as fh:  # the node's own copy, on its local disk
            fh.read(1)
        said = "".join(p.read_text(errors="replace") for p in logs.glob(f"{node['rank']}*.log"))
        if f"data: {staged}" not in said:
            raise DemoError(f"--data: rank(s) of node {node['rank']} did not read {staged} "
                            f"(logs: {logs})")
        ctx.ok(f"node {node['rank']} ({node['address']}): staged {node['objects']} object(s) "
               f"to {node['directory']} at {node['gbps']:.3f} GB/s; its ranks trained from it")
