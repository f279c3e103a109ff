"""The master's state machine (agent/master.py): every documented transition, and no other."""

from __future__ import annotations

import pytest

from bootstrap_scripts.agent.master import TERMINAL, TRANSITIONS, Event, Master, Phase

P, E = Phase, Event


@pytest.mark.parametrize(("phase", "event", "after"), [
    (P.STARTING, E.RESUMED, P.FORMED),
    (P.STARTING, E.TOOK_OVER, P.FORMED),
    (P.STARTING, E.NEW_CLUSTER, P.PREPARING),
    (P.STARTING, E.AWS_UNAVAILABLE, P.FAILED),
    (P.PREPARING, E.PREPARED, P.WAITING_FOR_GROUPS),
    (P.PREPARING, E.PREP_FAILED, P.FAILED),
    (P.WAITING_FOR_GROUPS, E.GROUPS_READY, P.FORMING),
    (P.WAITING_FOR_GROUPS, E.GROUP_FAILED, P.FAILED),
    (P.WAITING_FOR_GROUPS, E.SETUP_TIMEOUT, P.FAILED),
    (P.WAITING_FOR_GROUPS, E.NOTIFICATION_LOST, P.FAILED),
    (P.FORMING, E.CLUSTER_FORMED, P.FORMED),
    (P.FORMING, E.DISCOVERY_FAILED, P.FAILED),
])
def test_documented_transitions(phase, event, after):
    assert Master.decide(phase, event) is after


@pytest.mark.parametrize("phase", [p for p in Phase if p not in TERMINAL])
def test_stop_ends_every_live_state(phase):
    assert Master.decide(phase, Event.STOP) is Phase.STOPPED


def test_nothing_else_is_a_transition():
    for phase in Phase:
        for event in Event:
            if (phase, event) in TRANSITIONS or (event is Event.STOP and phase not in TERMINAL):
                continue
            with pytest.raises(ValueError, match="no transition"):
                Master.decide(phase, event)


def test_a_formed_master_cannot_fail_the_setup():
    assert not [e for (p, e), after in TRANSITIONS.items()
                if p is Phase.FORMED and after is Phase.FAILED]


def test_every_transition_is_in_the_docstring():
    """The module docstring's diagram lists each transition (state --event--> state)."""
    import re

    from bootstrap_scripts.agent import master

    drawn = {(a, e, b) for a, e, b in re.findall(r"^\s+(\w+)\s+--([a-z]+(?:-[a-z]+)*)-+> (\w+)",
                                                master.__doc__, flags=re.M)}
    table = {(p.name, e.value, after.name) for (p, e), after in TRANSITIONS.items()}
    assert table <= drawn, table - drawn
