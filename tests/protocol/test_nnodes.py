"""``--nnodes`` as one rule (``protocol.nnodes``): parsing, the defaults, torchrun's form."""

from __future__ import annotations

import pytest

from bootstrap_scripts.protocol.nnodes import (
    ELASTIC_MAX_NODES,
    NodeRange,
    NodeRangeError,
    check_torchrun_options,
    node_range,
    parse_nnodes,
)


@pytest.mark.parametrize(("given", "count", "elastic", "want", "text"), [
    ("", 4, False, NodeRange(4, 4), "4"),  # a fixed job: exactly its nodes
    ("", 4, True, NodeRange(1, ELASTIC_MAX_NODES), "1:64"),
    ("", 64, True, NodeRange(1, 64), "1:64"),
    ("", 65, True, NodeRange(1, 65), "1:65"),  # never a spare of the job's own nodes
    ("3", 4, False, NodeRange(3, 3), "3"),
    ("1:4", 6, True, NodeRange(1, 4), "1:4"),
    ("2:2", 2, True, NodeRange(2, 2), "2"),  # torchrun reads "2" as "2:2"
])
def test_the_range_a_job_runs_with(given, count, elastic, want, text):
    got = node_range(given, count, elastic=elastic)
    assert got == want and str(got) == text and parse_nnodes(text) == got


@pytest.mark.parametrize(("given", "elastic", "message"), [
    ("0", False, "1 <= MIN <= MAX"), ("4:2", False, "1 <= MIN <= MAX"),
    ("a", False, "N or MIN:MAX"), ("1:2:3", True, "N or MIN:MAX"),
    ("3", True, "an elastic job needs --nnodes MIN:MAX"),
])
def test_a_bad_value_is_refused_naming_it(given, elastic, message):
    with pytest.raises(NodeRangeError, match=f"{message}.*{given!r}"):
        node_range(given, 4, elastic=elastic)


def test_spares_and_room():
    r = NodeRange(1, 4)
    assert [r.spares(n) for n in (3, 4, 6)] == [0, 0, 2]
    assert r.has_room(3) and not r.has_room(4)
    with pytest.raises(NodeRangeError):
        NodeRange(3, 2)


def test_elastic_is_torchrun_s_alone():
    check_torchrun_options(None, True, None)  # dl-run's default launcher: torchrun
    check_torchrun_options("mpi", False, "3")
    with pytest.raises(NodeRangeError, match="not 'tf'"):
        check_torchrun_options("tf", True, None)
