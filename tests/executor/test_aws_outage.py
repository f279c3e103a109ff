"""An AWS outage on a node with a job role (real ``dl-executor``, real ``dl-run``): STS's
endpoint accepts connections and never answers, as a stopped server does. The executor's
heartbeat goes on (the call runs on a thread of its own), the share is not started, and
the job fails as an infrastructure fault naming the outage, never as a lost node."""

from __future__ import annotations

import socket

from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.paths import JobPaths
from bootstrap_scripts.protocol.records import FAULT_INFRASTRUCTURE, ShareExit
from emulator.resources import agent_settings, install_args
from tests.support.cluster import CLUSTER_ID

ROLE = f"arn:aws:iam::123456789012:role/{CLUSTER_ID}-job"


def test_sts_that_never_answers_fails_the_share_as_an_outage_not_a_lost_node(emu):
    silent = socket.socket()
    silent.bind(("127.0.0.1", 0))
    silent.listen(64)  # the kernel completes the connections; nobody ever reads them
    try:
        c = emu(1)
        node = c.nodes[0]
        settings = agent_settings(node.role, cluster_id=CLUSTER_ID, mount_point=str(c.efs))
        node.install(install_args({**settings, "job-role-arn": ROLE}))
        node.env.update({"AWS_ENDPOINT_URL": f"http://127.0.0.1:{silent.getsockname()[1]}",
                         "AWS_ACCESS_KEY_ID": "NODEKEY", "AWS_SECRET_ACCESS_KEY": "secret",
                         "AWS_SESSION_TOKEN": "token"})
        c.start_executors()
        res = c.run("--launcher", "each", "--", "python3", "-c", "print('job-body-ran')",
                    timeout=120)
        out = res.stdout
        assert res.returncode != 0, out
        # the runner's own judgement: the node answered all along
        assert "heartbeat stopped" not in out and "did not start its share" not in out, out
        assert "AWS did not answer" in out, out
        (jdir,) = c.job_dirs()
        rec = store.read_record(JobPaths(jdir).exit(0), ShareExit)
        assert rec is not None and rec.fault == FAULT_INFRASTRUCTURE, rec
        assert "AWS did not answer" in rec.reason, rec
        assert "job-body-ran" not in (store.read_text(JobPaths(jdir).log(0)) or "")
    finally:
        silent.close()
