"""Drill: the job controller's own records cannot be forged, by a user or by root on a worker.

A new controller (a restarted one, a new master's after a take-over) reads back what its
predecessor recorded: each job's record (state, restarts, the cost ledger ``--max-cost`` is
checked against), the circuit breaker's marks and the idle stop. Before, it read them from
``managed/<user>/<id>/job.json`` (which the controller writes as the job's user, so the user
can rewrite it), ``cluster/controller.json`` and ``cluster/idle-stop.json`` (which root on any
worker can write: EFS, AUTH_SYS). Now it believes only the copies the master signed with the
membership key (``jobs/engine/controller_records.py``; moto's real KMS server over HTTP), the
job's copy in root's ``cluster/managed/`` where no user can write.

(a) A REAL unprivileged user rewrites their own job.json (ledger zeroed, state changed) and
tries the controller's copy; (b) root on a worker (it has no ``kms:Sign`` on the membership
key: here, an attacker without the key, or signing with a key of its own) forges the
breaker's marks and the idle stop. The product's controller code reads them (``Controller``,
``sealed.recovered_job``, ``managed.queue``, ``EngineFacts``, ``IdleStop``). Each control
test plays the same forgery against the reader without the check (today's), to show it
WOULD be believed.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest

from bootstrap_scripts.agent.membership_key import MembershipKey
from bootstrap_scripts.jobs.controller import sealed
from bootstrap_scripts.jobs.controller.budget import JobBudget
from bootstrap_scripts.jobs.controller.daemon import Controller
from bootstrap_scripts.jobs.controller.engine_facts import EngineFacts, priced_usd
from bootstrap_scripts.jobs.controller.idle import IdleStop
from bootstrap_scripts.jobs.engine import controller_records, managed, root_jobs
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, Trust
from bootstrap_scripts.protocol import membership_signature, store
from bootstrap_scripts.protocol.managed_records import (
    AttemptUsage,
    BreakerMarks,
    IdleStopRecord,
    ManagedRequest,
    NodeUsage,
)
from bootstrap_scripts.protocol.paths import ClusterPaths
from bootstrap_scripts.protocol.run_request import RunRequest
from tests.conftest import REGION
from tests.security.conftest import as_user

pytestmark = [pytest.mark.slow]

#: the user's side: rewrite a JSON file of theirs with ``changes`` (sys.argv[2], JSON)
REWRITE = """
import json, os, sys
path, changes = sys.argv[1], json.loads(sys.argv[2])
doc = json.load(open(path))
doc.update(changes)
tmp = path + ".tmp"
open(tmp, "w").write(json.dumps(doc))
os.rename(tmp, path)
print("rewritten")
"""

#: the user's side: try to write a file (prints the error's name when refused)
TRY_WRITE = """
import sys
try:
    open(sys.argv[1], "w").write(sys.argv[2])
    print("written")
except OSError as exc:
    print(type(exc).__name__)
"""

#: an hour of one node at 10 USD/h: far past a 5 USD cap
SPENT = (AttemptUsage(attempt=1, started_at=time.time() - 3600,
                      nodes=(NodeUsage(instance_id="i-0w", usd_per_hour="10"),)),)


def install_key(root: Path, key: str) -> None:
    """What the installer writes from user data (``root_jobs.KEY_FILE``), root's."""
    path = root / root_jobs.KEY_FILE
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(root_jobs.render_key_file(key))


@pytest.fixture()
def master(moto_reset: str, shared_tmp: Path, monkeypatch) -> SimpleNamespace:
    """The master's root (the membership key installed, as the stack's user data does) and
    EFS in a directory every user can reach; the attacker's own key beside."""
    if os.geteuid() != 0:
        pytest.skip("writing records as the job's user needs root")
    monkeypatch.setenv("AWS_ENDPOINT_URL", moto_reset)
    kms = boto3.client("kms", endpoint_url=moto_reset, region_name=REGION)
    key, own = (kms.create_key(KeySpec="ECC_NIST_P256", KeyUsage="SIGN_VERIFY")["KeyMetadata"]
                ["Arn"] for _ in range(2))
    root, efs = shared_tmp / "master", shared_tmp / "efs"
    install_key(root, key)
    (efs / "cluster").mkdir(parents=True)
    os.chmod(shared_tmp, 0o755)
    return SimpleNamespace(root=root, efs=efs, key=key,
                           attacker=MembershipKey(own, REGION).sign)


def new_controller(m: SimpleNamespace, **kw) -> Controller:
    ctl = Controller(m.root, m.efs, region=REGION, **kw)
    assert ctl.seal.sign is not None and ctl.seal.ready(), "the master's key is not in use"
    return ctl


def users_job(m: SimpleNamespace, user, job_id: str = "train"):
    """A managed job of ``user`` as ``dl-run`` leaves it: their directory, their request
    (with ``--max-cost 5``)."""
    top = ClusterPaths(m.efs).managed_dir
    top.mkdir(mode=0o755, exist_ok=True)
    mine = top / user.pw_name
    mine.mkdir(mode=0o755, exist_ok=True)
    os.chown(mine, user.pw_uid, user.pw_gid)
    req = ManagedRequest(job_id=job_id, run=RunRequest(job_id=job_id, command=("true",)),
                         submitted_at=time.time() - 7200, user=user.pw_name,
                         max_cost_usd="5")
    d = mine / job_id
    d.mkdir(mode=0o755)
    os.chown(d, user.pw_uid, user.pw_gid)
    paths = ClusterPaths(m.efs).managed(job_id, user.pw_name)
    store.atomic_write(paths.request, req.to_json(), mode=0o600)
    os.chown(paths.request, user.pw_uid, user.pw_gid)
    return paths, req


def ran_an_hour(ctl: Controller, paths, req, *, state: str = "running"):
    """The first master's controller ran attempt 1 for an hour (10 USD): its records."""
    job = managed.view(paths)
    sup = ctl.supervisor(paths, req, job)
    sup.update(state="running", attempt=1, usage=SPENT, controller="i-0old/1",
               started_at=time.time() - 3600, max_cost_usd=req.max_cost_usd)
    if state != "running":
        sup.update(state=state, finished_at=time.time())
    return sup.job


def rewrite_as(user, path: Path, **changes) -> None:
    out = as_user(user, REWRITE, str(path), json.dumps(changes))
    assert out.stdout.strip() == "rewritten", out.stderr


# -- (a) a user edits their own job.json ----------------------------------------------------
def test_a_user_zeroing_their_ledger_does_not_lift_their_cap(master, victim,
                                                             reachable_python):
    m = master
    paths, req = users_job(m, victim)
    ran_an_hour(new_controller(m), paths, req)
    # the user zeroes the ledger (and the restart count) of their own running job, and
    # cannot touch the controller's copy (root's tree)
    rewrite_as(victim, paths.record, usage=[], restarts=0)
    rewrite_as(victim, paths.request, max_cost_usd="1000")  # and raises their own cap
    copy = ClusterPaths(m.efs).controller_job(paths.key)
    tried = as_user(victim, TRY_WRITE, str(copy), "{}")
    assert tried.stdout.strip() == "PermissionError", tried.stdout + tried.stderr
    assert managed.load_job(paths).usage == ()  # the user's file says nothing was spent
    assert managed.view(paths).usage == SPENT  # dl-jobs shows the controller's copy

    # a new master's controller resumes the job from the record the master signed
    ctl = new_controller(m)
    found = sealed.recovered_job(ctl.seal, m.efs, paths)
    assert found.job is not None and not found.distrust and found.signed
    assert found.job.usage == SPENT
    assert found.job.max_cost_usd == "5"  # recovery keeps the cap it picked the job up with
    assert "stopped at the cost cap" in JobBudget(req, None).stop_reason(found.job)
    # and counts its cost in the cluster's
    facts = EngineFacts(m.root, m.efs, seal=ctl.seal).now(at=time.time())
    assert facts.cluster_usd >= 10.0


def test_control_the_users_ledger_would_lift_the_cap(master, victim, reachable_python):
    """Without the check, what the user wrote is what a new controller resumed from."""
    m = master
    paths, req = users_job(m, victim)
    ran_an_hour(new_controller(m), paths, req)
    rewrite_as(victim, paths.record, usage=[], restarts=0)
    resumed = managed.load_job(paths)  # today's recovery read
    assert resumed is not None and resumed.state == "running"
    assert JobBudget(req, None).stop_reason(resumed) == ""
    assert priced_usd(resumed.usage, time.time()) == 0  # what ClusterCostUSD summed of it


def test_a_user_requeueing_their_finished_job_does_not_run_it_again(master, victim,
                                                                    reachable_python):
    m = master
    paths, req = users_job(m, victim)
    ran_an_hour(new_controller(m), paths, req, state="budget")
    rewrite_as(victim, paths.record, state="queued", usage=[], attempt=0)
    ctl = new_controller(m)
    assert managed.queue(m.efs, ctl.verify_root, ctl.seal) == []
    assert ctl.next_job() is None
    # control: today's queue took the user's word for it
    assert [p.key for p, _ in managed.queue(m.efs)] == [paths.key]


def test_a_user_replaying_an_older_signed_record_changes_nothing(master, victim,
                                                                  reachable_python):
    """The user saved the copy the master signed when the job had spent nothing, and puts
    it back as their job.json later: the controller does not read job.json at all."""
    m = master
    paths, req = users_job(m, victim)
    ctl1 = new_controller(m)
    sup = ctl1.supervisor(paths, req, managed.view(paths))
    sup.update(state="running", attempt=1, controller="i-0old/1")
    copy = ClusterPaths(m.efs).controller_job(paths.key)
    early = copy.read_text()  # readable by everyone (0644): the user keeps it
    assert json.loads(early)["usage"] == []
    sup.update(usage=SPENT)
    replay = as_user(victim, TRY_WRITE, str(paths.record), early)
    assert replay.stdout.strip() == "written"
    tried = as_user(victim, TRY_WRITE, str(copy), early)
    assert tried.stdout.strip() == "PermissionError"
    found = sealed.recovered_job(new_controller(m).seal, m.efs, paths)
    assert found.job is not None and found.job.usage == SPENT


def test_a_record_that_is_not_the_masters_fails_the_job_rather_than_resume_it(
        master, victim, reachable_python):
    """Root on a worker (it can write root's tree) rewrites the controller's copy: not
    resumed with a ledger the master did not write, but failed, saying why."""
    m = master
    paths, req = users_job(m, victim)
    ran_an_hour(new_controller(m), paths, req)
    copy = ClusterPaths(m.efs).controller_job(paths.key)
    doc = json.loads(copy.read_text())
    forgeries = {
        "unsigned": json.dumps({k: v for k, v in doc.items() if k != "signature"}
                               | {"usage": []}),
        "altered": json.dumps(doc | {"usage": []}),
        "own key": membership_signature.signed_text(
            json.dumps({k: v for k, v in doc.items() if k != "signature"} | {"usage": []}),
            m.attacker),
    }
    for name, text in forgeries.items():
        copy.write_text(text)
        found = sealed.recovered_job(new_controller(m).seal, m.efs, paths)
        assert found.distrust and "not the master's" in found.distrust, name
        assert str(copy) in found.distrust, name
    ctl = new_controller(m)
    ctl.recover()  # the job's attempt is not running (no runner): failed at once
    job = managed.load_job(paths)
    assert job.state == "failed" and "cannot be trusted" in job.message
    signed = controller_records.read_job(ctl.seal, m.efs, paths.key)
    assert signed.trust is Trust.SIGNED and signed.record.state == "failed"


def test_an_older_controllers_running_job_is_resumed_from_its_job_json(master, victim,
                                                                      reachable_python):
    """Upgrade: a job run by a controller that signed nothing has no copy: it is resumed
    from its job.json, as that controller would have (logged), not lost."""
    m = master
    paths, req = users_job(m, victim)
    sup = new_controller(m).supervisor(paths, req, managed.view(paths))
    sup.seal = None  # an older controller: no copy written
    sup.update(state="running", attempt=1, usage=SPENT, controller="i-0old/1")
    assert not ClusterPaths(m.efs).controller_job(paths.key).exists()
    found = sealed.recovered_job(new_controller(m).seal, m.efs, paths)
    assert found.job is not None and not found.distrust and found.job.usage == SPENT


# -- (b) root on a worker forges the breaker's marks and the idle stop ----------------------
def forged_marks(m: SimpleNamespace, how: str) -> None:
    """Three fresh marks (the breaker open for an hour: lost nodes no longer replaced)."""
    now = time.time()
    path = ClusterPaths(m.efs).breaker
    legit = path.read_text() if path.exists() else ""
    body = BreakerMarks(marks=(now - 30, now - 20, now - 10), updated_at=now,
                        controller="i-0m/1").to_json()
    if how == "unsigned":
        path.write_text(body)
    elif how == "altered":
        doc = json.loads(legit)
        doc["marks"] = [now - 30, now - 20, now - 10]
        path.write_text(json.dumps(doc))
    else:
        path.write_text(membership_signature.signed_text(body, m.attacker))


@pytest.mark.parametrize("how", ["unsigned", "altered", "own key"])
def test_forged_breaker_marks_do_not_hold_the_breaker_open(master, how):
    m = master
    first = new_controller(m, max_replacements=3)
    first.adopt_marks()
    first.breaker.save((time.time() - 600,))  # the master marked one instance, signed
    forged_marks(m, how)
    ctl = new_controller(m, max_replacements=3)
    ctl.adopt_marks()
    assert len(ctl.health.marks) <= 1  # the forged three are not counted
    assert ctl.health.recent_marks() == ()
    # the controller's heartbeat's copy is not read either
    store.write_record(ClusterPaths(m.efs).controller_heartbeat, dataclasses.replace(
        _heartbeat(), replacements=(time.time() - 5,) * 3))
    ctl.check_alone()
    ctl.adopt_marks()
    assert len(ctl.health.recent_marks()) <= 1


def test_control_unchecked_marks_would_hold_the_breaker_open(master):
    m = master
    new_controller(m).breaker.save((time.time() - 600,))
    forged_marks(m, "unsigned")
    ctl = new_controller(m, max_replacements=3)
    ctl.seal = ControllerSeal(None, None)  # a reader that checks nothing
    ctl.breaker = sealed.BreakerBook(ctl.seal, m.efs, ctl.me)
    ctl.adopt_marks()
    assert len(ctl.health.recent_marks()) == 3


def _heartbeat():
    from bootstrap_scripts.protocol.managed_records import ControllerHeartbeat

    return ControllerHeartbeat(pid=1, heartbeat=time.time() - 60, state="stopped")


def forged_idle(m: SimpleNamespace, how: str, **fields) -> None:
    now = time.time()
    body = IdleStopRecord(state="idle", updated_at=now, idle_seconds=3600.0,
                          idle_since=now - 7200, stop_at=now - 3600, **fields).to_json()
    path = ClusterPaths(m.efs).idle_stop
    if how == "unsigned":
        path.write_text(body)
    else:
        path.write_text(membership_signature.signed_text(body, m.attacker))


def idle_stop(m: SimpleNamespace, seal: ControllerSeal | None, calls: list):
    def stop(commit):
        if not commit("workers", 2, 0):
            return None
        calls.append(("stop",))
        return "workers", 2, 0

    def restore(desired: int, minimum: int) -> int:
        calls.append(("restore", desired, minimum))
        return desired

    return IdleStop(m.efs, idle_seconds=3600.0, stop=stop, restore=restore, seal=seal)


@pytest.mark.parametrize("how", ["unsigned", "own key"])
def test_a_forged_idle_stop_neither_stops_nor_sizes_the_workers(master, how):
    m = master
    seal = new_controller(m).seal
    forged_idle(m, how)  # "idle for two hours: stop them now"
    calls: list = []
    idle_stop(m, seal, calls).tick(queued=False)
    assert calls == []
    now = time.time()
    body = IdleStopRecord(state="stopped", updated_at=now, idle_seconds=3600.0,
                          stopped_at=now - 60, group="workers", desired_before=50,
                          min_before=50).to_json()
    ClusterPaths(m.efs).idle_stop.write_text(
        body if how == "unsigned" else membership_signature.signed_text(body, m.attacker))
    calls = []
    idle_stop(m, seal, calls).tick(queued=True)  # "a job waits: scale back to 50"
    assert calls == []
    # the record now on EFS is the master's own, signed
    found = seal.read(ClusterPaths(m.efs).idle_stop, IdleStopRecord, "idle-stop record")
    assert found.trust is Trust.SIGNED and found.record.state == "busy"


def test_control_an_unchecked_idle_stop_would_stop_and_size_the_workers(master):
    m = master
    forged_idle(m, "unsigned")
    calls: list = []
    idle_stop(m, None, calls).tick(queued=False)
    assert calls == [("stop",)]
    now = time.time()
    ClusterPaths(m.efs).idle_stop.write_text(IdleStopRecord(
        state="stopped", updated_at=now, idle_seconds=3600.0, stopped_at=now - 60,
        group="workers", desired_before=50, min_before=50).to_json())
    calls = []
    idle_stop(m, None, calls).tick(queued=True)
    assert calls == [("restore", 50, 50)]


def test_the_masters_own_idle_stop_is_carried_over(master):
    """What the master signed is believed: stopped workers come back at their size."""
    m = master
    seal = new_controller(m).seal
    now = time.time()
    seal.write(ClusterPaths(m.efs).idle_stop, IdleStopRecord(
        state="stopped", updated_at=now, idle_seconds=3600.0, stopped_at=now - 60,
        group="workers", desired_before=4, min_before=1))
    calls: list = []
    idle_stop(m, seal, calls).tick(queued=True)
    assert calls == [("restore", 4, 1)]
