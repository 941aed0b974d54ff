"""The lifecycle table: complete, closed, and every path ends in a terminal state."""

from __future__ import annotations

import pytest

from agent.errors import LifecycleError
from agent.lifecycle.recovery import RESUME
from agent.lifecycle.states import ORDER, SERVING_NEW, TERMINAL, Event, State
from agent.lifecycle.table import TRANSITIONS, events_from, next_state

NON_TERMINAL = [s for s in State if s not in TERMINAL]


def test_happy_path_walks_the_pinned_order():
    path = [State.RECEIVED]
    for event in (Event.ACCEPT, Event.FETCHED, Event.VERIFIED, Event.QUALIFIED, Event.ACTIVATED, Event.PASSED):
        path.append(next_state(path[-1], event))
    assert tuple(path) == ORDER


@pytest.mark.parametrize("state", NON_TERMINAL)
@pytest.mark.parametrize("event", [Event.FAIL, Event.TIMEOUT, Event.CANCEL, Event.SUPERSEDE])
def test_every_live_state_can_fail_time_out_and_be_cancelled(state, event):
    end = next_state(state, event)
    assert end in TERMINAL
    if state is State.PROBATION:  # the new model was serving: aborting restores the committed one
        assert end is State.ROLLED_BACK
    else:
        assert end is State.FAILED


@pytest.mark.parametrize("state", sorted(TERMINAL))
def test_terminal_states_have_no_way_out(state):
    assert events_from(state) == {}
    with pytest.raises(LifecycleError, match="illegal transition"):
        next_state(state, Event.RESUME)


def test_every_state_is_reachable_and_every_target_is_a_state():
    reachable = {State.RECEIVED}
    frontier = [State.RECEIVED]
    while frontier:
        for target in events_from(frontier.pop()).values():
            if target not in reachable:
                reachable.add(target)
                frontier.append(target)
    assert reachable == set(State)


def test_recovery_table_covers_every_live_state_with_a_legal_event():
    assert set(RESUME) == set(NON_TERMINAL)
    for state, (event, why) in RESUME.items():
        target = next_state(state, event)
        assert why
        if state in SERVING_NEW:  # an interrupted activation or probation rolls back
            assert target is State.ROLLED_BACK
        else:
            assert target is state


def test_unknown_names_and_illegal_edges_are_errors():
    with pytest.raises(LifecycleError, match="unknown"):
        next_state("flying", "accept")
    with pytest.raises(LifecycleError, match="illegal transition: event 'passed' in state 'downloading'"):
        next_state("downloading", "passed")


def test_persisted_values_equal_their_names():
    for s in State:
        assert s.value == s.name.lower() and str(s) == s.value
    for (s, e), t in TRANSITIONS.items():
        assert State(s.value) is s and Event(e.value) is e and State(t.value) is t
