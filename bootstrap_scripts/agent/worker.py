"""The worker's loop: watch the membership on EFS, apply every newer generation listing it.

The watch opens ``cluster/membership.json`` and ``fstat``s it every ``--watch-interval``
(0.25 s) rather than calling ``stat()``: on NFS, ``open()`` revalidates the name
(close-to-open consistency), while ``stat()`` may be answered from the attribute cache for
up to a minute. Before the first publish the cluster directory is opened each tick, so the
NFS client's cached "no such file" does not hide the first generation.

With ``--membership-key`` (the stack always sets it) a document is applied only once the
master's signature checks out with the key's public half (``protocol.membership_signature``):
root on another worker can write the file, not make this one apply it. The KMS client is
built, and the public key fetched, before the watch starts (``agent.membership_key``): at
the first document, every worker would do it when generation 1 arrives, all at once; with
the public key in hand, a check is local, no KMS call. A refused document is logged and
left alone until the next publish; a GetPublicKey that failed (network, throttling) is
retried on the next tick.

Every fourth tick the worker also looks for its own drain request: once the master drains
it, it stops heartbeating (it is leaving; a heartbeat now would only leave a ghost
registration behind) and copies the request to this node's own disk
(``var/lib/dl-agent/drain.json``), where its job executor finds it and stops its job shares.
With the key, only a request the master signed, for this instance, is taken: a worker can
write one on EFS for another worker, but drains nobody with it (:func:`accept_drain`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from bootstrap_scripts.agent import data_prep
from bootstrap_scripts.agent.membership_key import MembershipKeyError, membership_key
from bootstrap_scripts.protocol import membership_signature, store
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.membership import Membership
from bootstrap_scripts.protocol.membership_signature import Verifier
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.records import DrainRecord

if TYPE_CHECKING:
    from bootstrap_scripts.agent.context import AgentContext

#: Watch ticks between two looks for this node's drain request.
DRAIN_CHECK_TICKS = 4


def run_worker(agent: AgentContext) -> int:
    """Until ``agent.stop`` is set; 0 (a worker never fails the setup)."""
    config, cluster, log = agent.config, agent.cluster, agent.log
    iid = agent.identity.instance_id
    key = membership_key(config)
    if key is not None:
        key.prepare(log)  # now, not when generation 1 reaches every worker at once
    verify = key.verify if key else None
    if config.data_prep and not data_prep.prepare(config, agent.identity, stop=agent.stop,
                                                  log=log):
        if not agent.stop.is_set():
            log.error("event=not-joining reason=data-prep-failed (this node stays out of the "
                      "cluster; see %s)", cluster.prepared(iid, "failed"))
            agent.stop.wait()
        return 0
    path = cluster.membership
    drain_file = cluster.drain_request(iid)
    last: store.FileStamp | None = None
    refused: store.FileStamp | None = None  # the drain request not taken (until it changes)
    ticks = 0
    log.info("event=watch path=%s interval=%.2fs", path, config.watch_interval)
    while not agent.stop.is_set():
        current = store.stamp(path)
        if current is None:
            store.touch_directory(cluster.cluster_dir)  # let NFS notice a first publish sooner
        elif current != last:
            last = current if apply_from_efs(agent, cluster, verify) else None
        ticks += 1
        if not agent.draining and ticks % DRAIN_CHECK_TICKS == 0:
            stamp = store.stamp(drain_file)
            if stamp is not None and stamp != refused:
                taken = accept_drain(agent, verify)
                agent.draining = bool(taken)
                refused = stamp if taken is False else None
        agent.stop.wait(config.watch_interval)
    return 0


def accept_drain(agent: AgentContext, verify: Verifier | None) -> bool | None:
    """Take this node's drain request from EFS when the master signed it (with ``verify``)
    and it names this instance: copy it to the node's own ``applied_drain`` for the job
    executor; True. False (logged): not taken, looked at again only once the file changes;
    None: look again at the next check (gone meanwhile, or KMS could not be asked)."""
    path = agent.cluster.drain_request(agent.identity.instance_id)
    try:
        text = store.read_text(path, limit=store.NODE_RECORD_LIMIT)
        if text is None:
            return None
        if verify is not None:
            refused = membership_signature.check(text, verify, "drain request")
            if refused:
                agent.log.error("event=drain-refused path=%s reason=%s (not acted on: only "
                                "the master's signed request drains this node)", path, refused)
                return False
        record = DrainRecord.from_json(text, source=str(path))
    except FileNotFoundError:
        return None
    except MembershipKeyError as exc:
        agent.log.warning("event=drain-unverified path=%s error=%s (retrying)", path, exc)
        return None
    except (OSError, UnicodeDecodeError, ProtocolError) as exc:
        agent.log.warning("event=bad-drain-request path=%s error=%s", path, exc)
        return False
    if record.instance_id != agent.identity.instance_id:
        agent.log.error("event=drain-refused path=%s reason=it names instance %s, not this "
                        "one", path, record.instance_id)
        return False
    store.write_record(agent.paths.applied_drain, record)
    agent.log.info("event=draining path=%s (heartbeat stopped; the job executor stops this "
                   "node's shares)", path)
    return True


def apply_from_efs(agent: AgentContext, cluster: ClusterPaths,
                   verify: Verifier | None = None) -> bool:
    """Apply the live membership (idempotent: the same generation writes nothing, older
    ones are skipped); a malformed or unsigned document is logged and waited out. With
    ``verify``, only a document the master signed is applied. False: look again at the
    next tick (KMS could not be asked)."""
    try:
        text = store.read_text(cluster.membership)
        if text is None:
            return True
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
    except (OSError, ProtocolError) as exc:  # MembershipError is one
        agent.log.warning("event=bad-membership path=%s error=%s", cluster.membership, exc)
        return True
    agent.apply(m)
    return True
