"""The worker's loop: watch the membership on EFS, apply every newer generation listing it.

The watch opens ``cluster/membership.json`` and ``fstat``s it every ``--watch-interval``
(0.25 s) rather than calling ``stat()``: on NFS, ``open()`` revalidates the name
(close-to-open consistency), while ``stat()`` may be answered from the attribute cache for
up to a minute. Before the first publish the cluster directory is opened each tick, so the
NFS client's cached "no such file" does not hide the first generation.

With ``--membership-key`` (the stack always sets it) a document is applied only once KMS
confirms the master's signature (``protocol.membership_signature``): root on another worker
can write the file, not make this one apply it. A refused document is logged and left
alone until the next publish; a KMS call that failed (network, throttling) is retried on
the next tick.

Every fourth tick the worker also looks for its own drain request: once the master drains
it, it stops heartbeating (it is leaving; a heartbeat now would only leave a ghost
registration behind). Its job executor stops its job shares.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bootstrap_scripts.agent import data_prep
from bootstrap_scripts.agent.membership_key import MembershipKeyError, membership_verifier
from bootstrap_scripts.protocol import membership_signature, store
from bootstrap_scripts.protocol.membership import Membership, MembershipError
from bootstrap_scripts.protocol.membership_signature import Verifier
from bootstrap_scripts.protocol.paths import ClusterPaths

if TYPE_CHECKING:
    from bootstrap_scripts.agent.context import AgentContext

#: Watch ticks between two looks for this node's drain request.
DRAIN_CHECK_TICKS = 4


def run_worker(agent: AgentContext) -> int:
    """Until ``agent.stop`` is set; 0 (a worker never fails the setup)."""
    config, cluster, log = agent.config, agent.cluster, agent.log
    iid = agent.identity.instance_id
    if config.data_prep and not data_prep.prepare(config, agent.identity, stop=agent.stop,
                                                  log=log):
        if not agent.stop.is_set():
            log.error("event=not-joining reason=data-prep-failed (this node stays out of the "
                      "cluster; see %s)", cluster.prepared(iid, "failed"))
            agent.stop.wait()
        return 0
    path = cluster.membership
    verify = membership_verifier(config)
    drain_file = cluster.drain_request(iid)
    last: store.FileStamp | None = None
    ticks = 0
    log.info("event=watch path=%s interval=%.2fs", path, config.watch_interval)
    while not agent.stop.is_set():
        current = store.stamp(path)
        if current is None:
            store.touch_directory(cluster.cluster_dir)  # let NFS notice a first publish sooner
        elif current != last:
            last = current if apply_from_efs(agent, cluster, verify) else None
        ticks += 1
        if not agent.draining and ticks % DRAIN_CHECK_TICKS == 0 and store.exists(drain_file):
            agent.draining = True
            log.info("event=draining path=%s (heartbeat stopped; the job executor stops this "
                     "node's shares)", drain_file)
        agent.stop.wait(config.watch_interval)
    return 0


def apply_from_efs(agent: AgentContext, cluster: ClusterPaths,
                   verify: Verifier | None = None) -> bool:
    """Apply the live membership (idempotent: the same generation writes nothing, older
    ones are skipped); a malformed or unsigned document is logged and waited out. With
    ``verify``, only a document the master signed is applied. False: look again at the
    next tick (KMS could not be asked)."""
    try:
        text = cluster.membership.read_text()
        if verify is not None:
            refused = membership_signature.check(text, verify)
            if refused:
                agent.log.error("event=membership-refused path=%s reason=%s (not applied)",
                                cluster.membership, refused)
                return True
        m = Membership.from_json(text)
    except FileNotFoundError:
        return True
    except MembershipKeyError as exc:
        agent.log.warning("event=membership-unverified path=%s error=%s (retrying)",
                          cluster.membership, exc)
        return False
    except (OSError, UnicodeDecodeError, MembershipError) as exc:
        agent.log.warning("event=bad-membership path=%s error=%s", cluster.membership, exc)
        return True
    agent.apply(m)
    return True
