"""Network errors in the ranks are the network's, not the code's (``engine/classify.py``,
the runner's ``summary.py``): a rank whose last error line is torchrun's rendezvous store out
of reach, a gloo connection reset or closed, NCCL's remote error, is classed
``infrastructure`` (``network``) and restarted without counting as a code failure; a code
failure on any node still wins (its peers lose their connections because of it)."""

from __future__ import annotations

import pytest

from bootstrap_scripts.jobs.engine.classify import (
    FailureClass,
    FailureKind,
    classify,
    network_error,
)
from bootstrap_scripts.jobs.engine.restart_policy import Action, Policy, decide
from bootstrap_scripts.jobs.engine.summary import summarize
from bootstrap_scripts.jobs.engine.watch import Watch
from bootstrap_scripts.protocol import store
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import JobResult, ShareExit
from bootstrap_scripts.protocol.run_request import RunRequest

RDZV = ("torch.distributed.elastic.rendezvous.api.RendezvousConnectionError: The connection "
        "to the C10d store has failed. See inner exception for details.")
GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:598] Connection closed "
        "by peer [127.21.0.3]:43771")
RESET = ("RuntimeError: [/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:534] Read error "
         "[127.21.0.2]:19831: Connection reset by peer")
NCCL = ("torch.distributed.DistBackendError: NCCL error in: ProcessGroupNCCL.cpp:1970, remote "
        "process exited or there was a network error, NCCL version 2.18.1 ncclRemoteError")
CODE = "ValueError: shapes (3,) and (4,) not aligned"


@pytest.mark.parametrize(("line", "network"), [
    (RDZV, True), (GLOO, True), (RESET, True), (NCCL, True),
    ("torch.distributed.DistNetworkError: Connection reset by peer", True),
    # a partitioned peer: the kernel's own words, and gloo's when the mesh cannot form
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:799] connect "
     "[127.21.0.3]:4711: No route to host", True),
    ("OSError: [Errno 101] Network is unreachable", True),
    ("RuntimeError: Gloo connectFullMesh failed with [../third_party/gloo/gloo/transport/"
     "tcp/pair.cc:144] no error", True),
    # a collective's timeout says a peer did not answer, not why: its code may be the cause
    ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/unbound_buffer.cc:81] Timed out "
     "waiting 1800000ms for recv operation to complete", False),
    (CODE, False), ("RuntimeError: CUDA out of memory", False),
    ("KeyError: 'loss'", False), ("", False),
])
def test_a_network_error_line_is_told_from_a_code_error(line, network):
    assert network_error(line) is network


def run(tmp_path, lines: dict[int, str]) -> JobResult:
    """Both shares exited 1 having printed ``lines`` (rank -> its last error line)."""
    spec = JobSpec(job_id="j.1", launcher="each", shares=tuple(
        Share(r, f"10.0.1.{r}", (Proc(argv=("true",)),)) for r in (0, 1)))
    paths = ClusterPaths(tmp_path).job("j.1")
    paths.nodes.mkdir(parents=True)
    w = Watch(spec, paths, tmp_path, RunRequest(job_id="j.1", command=("true",)))
    for rank, line in lines.items():
        paths.log(rank).write_text(f"step 1\nTraceback (most recent call last):\n{line}\n")
        w.exits[rank] = ShareExit(rank=rank, address=f"10.0.1.{rank}", returncode=1,
                                  finished_at=float(rank))
    summarize(w)
    return store.read_record(paths.result, JobResult)


def test_ranks_that_lost_their_peers_are_the_networks_failure(tmp_path, capsys):
    result = run(tmp_path, {0: RDZV, 1: GLOO})
    failure = classify(result, {})
    assert failure is not None and failure.kind is FailureKind.NETWORK, failure
    assert failure.failure_class is FailureClass.INFRASTRUCTURE
    assert "RendezvousConnectionError" in failure.detail
    out = capsys.readouterr().err
    assert "cause: infrastructure (network)" in out, out
    d = decide(failure, restarts=0, code_restarts=0, policy=Policy(max_code_restarts=0))
    assert d.action is Action.RESTART  # not "a failure of the command ... not retried"


def test_a_code_failure_on_one_node_wins_over_its_peers_network_errors(tmp_path, capsys):
    result = run(tmp_path, {0: CODE, 1: RESET})
    failure = classify(result, {})
    assert failure is not None and failure.kind is FailureKind.CODE and failure.rank == 0
