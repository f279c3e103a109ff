"""Every reader of a file a user or a worker's root can write is total: whatever is in the
file's place (arbitrary bytes, JSON of any shape and type, nesting 100,000 deep, a file far
larger than any record, a FIFO with or without a writer, a socket, a device, a directory, a
link), the reader returns (a record, None, a refusal value) or raises only the refusal it
documents, and never blocks.

One harness, parametrized over :data:`READERS`: a new reader is one :class:`Reader` line
(its file, the call the daemon makes, a valid document as its writer writes it, and the
refusal it may raise, none for the readers that must simply return). Each reader's valid
document is read back as a control, so the harness can tell a reader that refuses
everything from one that reads. Every record type of the protocol is also read through the
two generic readers (``store.read_record_or_none``, ``userfiles.read_record_or_none``).
"""

from __future__ import annotations

import contextlib
import json
import logging
import tempfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from bootstrap_scripts.data.checkpoint_mirror import STATUS_FILE, local_listing, read_status
from bootstrap_scripts.data.checkpoint_plan import survey
from bootstrap_scripts.jobs.controller import attempts
from bootstrap_scripts.jobs.engine import checkpoints, managed, userfiles
from bootstrap_scripts.jobs.engine.controller_records import ControllerSeal, Trust
from bootstrap_scripts.jobs.engine.node_env import read_node_env
from bootstrap_scripts.jobs.executor.listen_guard import ListenGuard
from bootstrap_scripts.jobs.executor.node import ThisNode
from bootstrap_scripts.node import node_keys
from bootstrap_scripts.protocol import managed_records, records, state, store
from bootstrap_scripts.protocol import node_signature as nsig
from bootstrap_scripts.protocol.errors import ProtocolError
from bootstrap_scripts.protocol.jobs import JobSpec, Proc, Share
from bootstrap_scripts.protocol.membership import Membership, build_membership
from bootstrap_scripts.protocol.paths import ClusterPaths, JobPaths, ManagedPaths, NodePaths
from bootstrap_scripts.protocol.record_base import Record
from tests.support import hostile_files as hostile

INSTANCE = "i-0aaaaaaaaaaaaaaa0"
ADDRESS = "10.0.0.4"
KEY = nsig.new_private_key()
LOG = logging.getLogger("reader-fuzz")


def on_efs(path: Callable[[ClusterPaths], Path]) -> str:
    """A cluster file's path relative to the EFS root, as :class:`ClusterPaths` lays it."""
    return str(path(ClusterPaths(Path("/efs"))).relative_to("/efs"))


# -- valid documents, as their writers write them ------------------------------------------
def spec_text() -> str:
    return JobSpec(job_id="j", launcher="each",
                   shares=(Share(0, ADDRESS, (Proc(argv=("/bin/true",)),)),),
                   env={"A": "1"}, created_at=1.0e9).to_json()


def membership_text() -> str:
    return build_membership(cluster_id="c", generation=1, efs_mount="/efs",
                            master={"instance_id": INSTANCE, "address": ADDRESS, "gpus": 0},
                            workers=[]).to_json()


def job_text() -> str:
    return managed_records.ManagedJob(job_id="j", state="running", user="u").to_json()


def heartbeat_text() -> str:
    hb = records.ExecutorHeartbeat(address=ADDRESS, heartbeat=1.0e9, generation=1)
    return nsig.signed_record(hb.to_json(), nsig.signer(KEY, INSTANCE))


def manifest_text() -> str:
    return json.dumps({"format": "dl-checkpoint/1", "name": "step-1", "global_step": 1,
                       "written_at": 1.0e9, "files": [{"path": "step-1.bin", "size": 4}],
                       "meta": {"epoch": 1, "step": 1}})


# -- the readers, each as its daemon calls it -----------------------------------------------
def read_spec(efs: Path) -> JobSpec:
    """The executors', the controller's and ``dl-jobs``'s read of a job's spec."""
    owned = userfiles.read_owned(efs / "jobs/u/j", "spec.json")
    return JobSpec.from_json(owned.text)


def view_job(efs: Path) -> object:
    """The controller's and ``dl-jobs``'s view of a managed job (job.json, request.json)."""
    return managed.view(ManagedPaths(efs / "managed/u/j"))


def judge_heartbeat(efs: Path) -> object:
    """The master's check of a node's executor heartbeat (its signature, then the record)."""
    book = node_keys.KeyBook(NodePaths(efs / "master"))
    book.open()
    book.save(INSTANCE, nsig.public_pem(KEY))
    check = node_keys.RecordCheck(book, LOG)
    rec, _why = check.judge(ClusterPaths(efs).executor_heartbeat(ADDRESS),
                            records.ExecutorHeartbeat, instance_id=INSTANCE,
                            what="executor heartbeat")
    return rec


def sealed_job(efs: Path) -> object:
    """The controller's read of its own (sealed) copy of a job record."""
    found = ControllerSeal(None, None, log=LOG).read(
        ClusterPaths(efs).controller_job("u/j"), managed_records.ManagedJob, "job record")
    return found.record if found.trust is Trust.SIGNED else None


def checkpoint_survey(efs: Path) -> object:
    ckdir = efs / "checkpoints/u/j"
    (ckdir / "step-1.bin").write_bytes(b"data")  # the checkpoint's data the manifest lists
    return survey(*local_listing(ckdir)).newest


def node_listeners(efs: Path) -> object:
    """What another node's executor takes from a node's record of its jobs' listeners."""
    guard = ListenGuard(ThisNode(NodePaths(efs / "node"), ClusterPaths(efs), "10.0.0.9"))
    guard.read_others()
    seen = guard.others.get(ADDRESS)
    return seen[1] if seen else None


def listeners_text() -> str:
    return records.NodeListeners(address=ADDRESS, seq=5, listening=(
        records.Listening(host=ADDRESS, port=41234, uid=1001),)).to_json()


def ANY(got: object) -> bool:
    """The ``expect`` of a reader whose value cannot tell a read from a refusal."""
    return True


@dataclass(frozen=True)
class Reader:
    """One reader: ``read(efs)`` after ``file`` (relative to ``efs``) was planted. The
    reader may raise only ``refusals`` (none: it must return); ``valid`` is read back
    (``expect`` says what it must give) as the control."""

    name: str
    file: str
    read: Callable[[Path], object]
    valid: Callable[[], str]
    expect: Callable[[object], bool] = lambda got: got is not None
    refusals: tuple[type[BaseException], ...] = ()


READERS = [
    Reader("job spec", "jobs/u/j/spec.json", read_spec, spec_text,
           refusals=(OSError, ProtocolError)),
    Reader("attempt spec (controller)", "jobs/u/j/spec.json",
           lambda efs: attempts.shares_started_at(JobPaths(efs / "jobs/u/j")), spec_text,
           expect=ANY),  # no share started: None, a spec or not
    Reader("managed job.json", "managed/u/j/job.json", view_job, job_text),
    Reader("managed request.json", "managed/u/j/request.json", view_job, job_text,
           expect=ANY),  # a job record is no request: only totality counts
    Reader("controller's sealed job", on_efs(lambda c: c.controller_job("u/j")), sealed_job,
           job_text),
    Reader("membership", on_efs(lambda c: c.membership),
           lambda efs: Membership.load(ClusterPaths(efs).membership), membership_text,
           refusals=(OSError, ProtocolError)),
    Reader("membership (dl-health, dl-scale)", on_efs(lambda c: c.membership),
           lambda efs: state.read_current(efs), membership_text, refusals=(ProtocolError,)),
    Reader("executor heartbeat (signed)", on_efs(lambda c: c.executor_heartbeat(ADDRESS)),
           judge_heartbeat, heartbeat_text),
    Reader("drain request", on_efs(lambda c: c.drain_request(INSTANCE)),
           lambda efs: state.read_drain(efs, INSTANCE),
           lambda: records.DrainRecord(instance_id=INSTANCE, address=ADDRESS,
                                       requested_at=1.0e9, deadline=1.0e9 + 240, asg="g",
                                       role="worker", lifecycle_hook="h",
                                       lifecycle_action_token="t").to_json()),
    Reader("checkpoint latest.json", "checkpoints/u/j/latest.json",
           lambda efs: checkpoints.checkpoint_position(efs / "checkpoints/u/j"),
           lambda: '{"epoch": 3, "step": 7}', expect=lambda got: got == (3, 7)),
    Reader("checkpoint manifest", "checkpoints/u/j/step-1.manifest.json", checkpoint_survey,
           manifest_text),
    Reader("checkpoint mirror status", f"checkpoints/u/j/{STATUS_FILE}",
           lambda efs: read_status(efs / "checkpoints/u/j"),
           lambda: '{"manifest": "s3://b/p/step-1.manifest.json"}', expect=bool),
    Reader("node listeners (listen guard)", on_efs(lambda c: c.listeners(ADDRESS, 5)),
           node_listeners, listeners_text),
    Reader("node env file", "node/" + str(NodePaths(Path("/n")).env.relative_to("/n")),
           lambda efs: read_node_env(NodePaths(efs / "node")), lambda: "EFS_MOUNT=/efs\n",
           expect=bool),
]


def _record_types() -> list[type[Record]]:
    found, todo = [], list(Record.__subclasses__())
    while todo:
        cls = todo.pop()
        found.append(cls)
        todo += cls.__subclasses__()
    return sorted(set(found), key=lambda c: (c.__module__, c.__name__))


#: every record type of the protocol, read by the two generic readers (total: None or it)
GENERIC = [Reader(f"{cls.__name__} ({how})", "jobs/u/j/record.json", read, lambda: "{}",
                  expect=ANY)
           for cls in _record_types()
           for how, read in (
               ("store", lambda efs, c=cls: store.read_record_or_none(
                   efs / "jobs/u/j/record.json", c)),
               ("userfiles", lambda efs, c=cls: userfiles.read_record_or_none(
                   efs / "jobs/u/j/record.json", c)))]


@contextlib.contextmanager
def efs_root() -> Iterator[Path]:
    with tempfile.TemporaryDirectory(prefix="dl-fuzz-") as tmp:
        yield Path(tmp)


def read_planted(reader: Reader, efs: Path) -> object:
    """``reader`` on what is planted: its value, having raised nothing but its refusals."""
    value, error = hostile.returns(lambda: reader.read(efs), efs / reader.file)
    if error is not None and not isinstance(error, reader.refusals or ()):
        raise AssertionError(f"{reader.name}: {type(error).__name__} escaped the reader "
                             f"(refusals: {reader.refusals})") from error
    return value


IDS = [r.name for r in READERS]
FUZZ = settings(max_examples=25, deadline=None,
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])
FEW = settings(max_examples=6, deadline=None,
               suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large])

scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=12)
json_values = st.recursive(scalars, lambda inner: st.lists(inner, max_size=4)
                           | st.dictionaries(st.text(max_size=10), inner, max_size=4),
                           max_leaves=16)


@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_the_valid_document_is_read(reader: Reader):
    """The control: what its writer writes, the reader reads."""
    with efs_root() as efs:
        hostile.write(efs / reader.file, reader.valid())
        got = read_planted(reader, efs)
        assert reader.expect(got), f"{reader.name}: the valid document gave {got!r}"


@pytest.mark.parametrize("reader", READERS, ids=IDS)
@FUZZ
@given(content=st.binary(max_size=600))
def test_arbitrary_bytes(reader: Reader, content: bytes):
    with efs_root() as efs:
        hostile.write(efs / reader.file, content)
        read_planted(reader, efs)


@pytest.mark.parametrize("reader", READERS, ids=IDS)
@FUZZ
@given(value=json_values)
def test_arbitrary_json(reader: Reader, value: object):
    with efs_root() as efs:
        hostile.write(efs / reader.file, json.dumps(value))
        read_planted(reader, efs)


@pytest.mark.parametrize("reader", READERS, ids=IDS)
@FUZZ
@given(data=st.data())
def test_a_valid_document_with_one_field_of_any_type(reader: Reader, data):
    """The valid document with one of its fields (at any depth) replaced by any JSON:
    the shape checks, not the JSON decoder, are what this reaches."""
    with efs_root() as efs:
        doc = json.loads(reader.valid()) if reader.valid().lstrip().startswith("{") else None
        if not isinstance(doc, dict) or not doc:
            return
        target = doc
        while True:
            key = data.draw(st.sampled_from(sorted(target)))
            inner = target[key]
            if isinstance(inner, dict) and inner and data.draw(st.booleans()):
                target = inner
                continue
            if isinstance(inner, list) and inner and isinstance(inner[0], dict) \
                    and data.draw(st.booleans()):
                target = inner[0]
                continue
            break
        target[key] = data.draw(json_values)
        hostile.write(efs / reader.file, json.dumps(doc))
        read_planted(reader, efs)


@pytest.mark.parametrize("reader", READERS, ids=IDS)
@FEW
@given(levels=st.integers(65, hostile.DEEP), opener=st.sampled_from("[{"),
       inside=st.booleans())
def test_nesting_to_a_hundred_thousand(reader: Reader, levels: int, opener: str,
                                       inside: bool):
    with efs_root() as efs:
        deep = hostile.deep_json(levels, opener)
        if inside and reader.valid().lstrip().startswith("{"):  # deep inside a valid record
            deep = reader.valid().rstrip().rstrip("}") + f', "zz": {deep}}}'
        hostile.write(efs / reader.file, deep)
        read_planted(reader, efs)


@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_the_deepest_document_at_once(reader: Reader):
    """100,000 levels exactly, both kinds (hypothesis may not draw the bound itself)."""
    with efs_root() as efs:
        for opener in "[{":
            hostile.write(efs / reader.file, hostile.deep_json(hostile.DEEP, opener))
            read_planted(reader, efs)


@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_a_file_larger_than_any_bound(reader: Reader):
    with efs_root() as efs:
        hostile.huge(efs / reader.file, userfiles.MAX_READ_BYTES + 1)
        got = read_planted(reader, efs)
        assert reader.expect is ANY or not reader.expect(got), f"{reader.name}: read {got!r}"


@pytest.mark.parametrize("kind", hostile.SPECIAL)
@pytest.mark.parametrize("reader", READERS, ids=IDS)
def test_no_regular_file_in_the_records_place(reader: Reader, kind: str):
    with efs_root() as efs:
        undo = hostile.plant(efs / reader.file, kind, valid=reader.valid())
        try:
            got = read_planted(reader, efs)
        finally:
            undo()
        if kind == "link-to-record" and reader.expect is not ANY:
            assert not reader.expect(got), f"{reader.name}: a link was followed to {got!r}"


@pytest.mark.parametrize("reader", GENERIC, ids=[r.name for r in GENERIC])
@FEW
@given(content=st.binary(max_size=300) | json_values.map(json.dumps).map(str.encode)
       | st.integers(65, hostile.DEEP).map(lambda n: hostile.deep_json(n).encode()))
def test_every_record_type_through_the_generic_readers(reader: Reader, content: bytes):
    with efs_root() as efs:
        hostile.write(efs / reader.file, content)
        read_planted(reader, efs)


@pytest.mark.parametrize("kind", hostile.SPECIAL)
def test_the_generic_readers_on_no_regular_file(kind: str):
    with efs_root() as efs:
        for reader in GENERIC[:2]:
            undo = hostile.plant(efs / reader.file, kind, valid="{}")
            try:
                assert read_planted(reader, efs) is None
            finally:
                undo()
