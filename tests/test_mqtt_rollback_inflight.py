"""A signed rollback to the version that already serves, while a newer one is still in flight (waiting in the
qualification queue, or on probation): the device calls the newer one off and ends on the version it was told,
so a halted rollout's control plane sees a confirmed state instead of waiting for its deadline."""

from __future__ import annotations

import threading
from dataclasses import replace

import pytest
from support.agent import make_agent, queue_holder
from support.mqtt import mqtt_config, wait_for

from agent.fleet import rollout_state as rs
from agent.lifecycle.intake import Intake
from agent.samples import sample_tiny_package


def _push(cp, tmp_path, version, rollback=False):
    pkg = sample_tiny_package(tmp_path / f"pkg-{version}", version=version)
    cp.to_device("tiny", cp.envelope(cp.manifest(pkg, "tiny", version, rollback=rollback)))


def _ended(agent, version):
    deps = [d for d in agent.orchestrator.journal.all() if d.model == "tiny" and d.version == version and d.terminal]
    return deps[-1] if deps else None


@pytest.mark.parametrize("where", ["queued", "probation"])
def test_a_signed_rollback_calls_off_the_version_still_in_flight(tmp_path, mosquitto, plane, where):
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, plane)
    plane.register("dev-1", cfg.state_dir)  # the control plane believes its signed status
    agent = make_agent(None, config=cfg, probation_s=0.3, serve_http=False, known_providers=["cpu"], start=True)
    hold, held = threading.Event(), threading.Event()

    t = queue_holder(agent, hold, held, 300)  # another package's qualification holds the device
    try:
        _push(plane, tmp_path, "1")
        wait_for(lambda: getattr(agent.steps.slots.committed("tiny"), "version", None) == "1", what="v1 committed")
        if where == "queued":
            t.start()
            assert held.wait(30)
        else:
            agent.steps.config = replace(
                agent.steps.config, probation_s=300
            )  # v2 stays on probation until something stops it
        _push(plane, tmp_path, "2")
        # queued: the package check (verifying) and the measurement (qualifying) both wait for the queue's turn
        states = {"queued": ("verifying", "qualifying"), "probation": ("probation",)}[where]
        wait_for(
            lambda: any(d.version == "2" and d.state.value in states for d in agent.orchestrator.in_flight().values()),
            what=f"v2 {' or '.join(states)}",
        )
        if where == "queued":
            # the journal says verifying a moment before the worker asks the queue for its turn
            wait_for(lambda: agent.status()["qualification_queue"]["waiting"], what="v2 waiting in the queue")

        _push(plane, tmp_path, "1", rollback=True)  # what the rollout engine publishes at a halt
        v2 = wait_for(lambda: _ended(agent, "2"), 120, "v2 called off")  # the queue is still held / probation runs
        assert v2.state.value != "committed", v2.reason
        assert "serves already" in (v2.reason or ""), v2.reason
        assert agent.steps.slots.committed("tiny").version == "1"
        wait_for(lambda: not agent.orchestrator.in_flight(), 60, "nothing in flight")
        # The control plane's reading of the retained status: version 1 runs, version 2 does not (confirmed).
        doc = wait_for(
            lambda: (d := plane.status_of("dev-1")) and rs.observe(d, "tiny", "1")[0] == rs.SUCCEEDED and d,
            60,
            "a verified status with version 1",
        )
        assert doc["trust"] == "verified" and not rs.holds(doc, "tiny", "2"), doc
    finally:
        hold.set()
        if t.is_alive():
            t.join(30)
        agent.stop()


class _TooLate:
    """The orchestrator as Intake drives it (agent.lifecycle.intake.Lifecycle), with a cancel that, like one
    arriving as the commit is journaled, changes nothing: it only records the reason."""

    def __init__(self, orchestrator, late: list[str]):
        self.submit, self.seen, self.in_flight = orchestrator.submit, orchestrator.seen, orchestrator.in_flight
        self.late = late

    def cancel(self, target: str, reason: str = "") -> None:
        self.late.append(reason)


def test_a_rollback_that_comes_too_late_to_call_off_undoes_the_commit(tmp_path, mosquitto, plane):
    """The halt's rollback arrives as version 2's probation ends: the cancel is too late and 2 commits. The desired
    state (1, signed as a rollback) still wins once 2 has ended: the device goes back to 1, and the rollout reads
    it as rolled back. The race is made certain by a cancel port that, like a cancel arriving as the commit is
    journaled, changes nothing."""
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, plane)
    plane.register("dev-1", cfg.state_dir)
    agent = make_agent(None, config=cfg, probation_s=0.3, serve_http=False, known_providers=["cpu"], start=True)
    late: list[str] = []
    try:
        _push(plane, tmp_path, "1")
        wait_for(lambda: getattr(agent.steps.slots.committed("tiny"), "version", None) == "1", what="v1 committed")
        agent.steps.config = replace(agent.steps.config, probation_s=8)
        _push(plane, tmp_path, "2")
        wait_for(
            lambda: any(
                d.version == "2" and d.state.value == "probation" for d in agent.orchestrator.in_flight().values()
            ),
            what="v2 on probation",
        )
        assert agent.link is not None
        agent.link.deployments = Intake(_TooLate(agent.orchestrator, late))  # the cancel comes too late: it goes on
        _push(plane, tmp_path, "1", rollback=True)
        wait_for(lambda: late, 60, "the rollback to call v2 off")
        v2 = wait_for(lambda: _ended(agent, "2"), 120, "v2 ended")
        assert v2.state.value == "committed", v2.reason  # the cancel changed nothing
        back = wait_for(
            lambda: [d for d in agent.orchestrator.journal.all() if d.version == "1" and d.seq > v2.seq and d.terminal],
            120,
            "a deployment of 1 after 2 committed",
        )
        assert back[-1].state.value == "committed", back[-1].reason
        assert agent.steps.slots.committed("tiny").version == "1"
        doc = wait_for(
            lambda: (d := plane.status_of("dev-1")) and rs.observe(d, "tiny", "1")[0] == rs.SUCCEEDED and d,
            60,
            "a verified status with version 1",
        )
        assert not rs.holds(doc, "tiny", "2") and rs.held_before(doc, "tiny", "2"), doc["models"]
    finally:
        agent.stop()
