"""Forged, unsigned, untrusted-key and future-dated desired state against a real Mosquitto: nothing that runs
changes (a version in probation stays and commits; a first deployment keeps serving); precedence between device
and group desired state uses verified fields only."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest
from support.agent import make_agent
from support.mqtt import mqtt_config, wait_for

from agent.samples import sample_tiny_package

ATTACKS = ("forged", "unsigned", "untrusted", "future")
DAY = 86400


def _agent(tmp_path, mosquitto, cp, probation_s=0.3, groups=()):
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, cp, groups=groups)
    events: list[dict] = []
    a = make_agent(
        None, config=cfg, probation_s=probation_s, on_event=events.append, serve_http=False, known_providers=["cpu"]
    )
    a.events = events
    return a.start()


def _pkg(tmp_path, version):
    return sample_tiny_package(tmp_path / f"pkg-{version}", version=version)


def _attack(cp, tmp_path, how, version, to="device"):
    """Publish a hostile desired state for `tiny`: forged (all-zero signature), unsigned, untrusted key, or
    correctly signed but issued 30 days ahead of the device clock."""
    issued = time.time() + 30 * DAY if how == "future" else None
    groups = ("lab",) if to == "group" else ()
    devices = () if to == "group" else ("dev-1",)
    m = cp.manifest(_pkg(tmp_path, version), "tiny", version, devices=devices, groups=groups, issued=issued)
    env = cp.envelope(m, how="signed" if how == "future" else how)
    if to == "group":
        cp.to_group("lab", "tiny", env)
    else:
        cp.to_device("tiny", env)


def _rejected(agent, version, code):
    rec = (agent.status().get("rejected") or {}).get("tiny") or {}
    return rec.get("version") == version and rec.get("code") == code


CODES = {"forged": "bad-signature", "unsigned": "unsigned", "untrusted": "untrusted-key", "future": "future-dated"}


def _journal(agent):
    return [(d.version, d.state.value) for d in agent.orchestrator.journal.all() if d.model == "tiny"]


def test_attacks_leave_a_version_in_probation_alone(tmp_path, mosquitto, plane):
    a = _agent(tmp_path, mosquitto, plane)
    try:
        plane.to_device("tiny", plane.envelope(plane.manifest(_pkg(tmp_path, "1"), "tiny", "1")))
        wait_for(lambda: getattr(a.steps.slots.committed("tiny"), "version", None) == "1", what="v1 committed")
        a.steps.config = replace(a.steps.config, probation_s=20)  # v2 is in probation while the attacks land
        plane.to_device("tiny", plane.envelope(plane.manifest(_pkg(tmp_path, "2"), "tiny", "2")))
        v2 = wait_for(
            lambda: next((d for d in a.orchestrator.in_flight().values() if d.state.value == "probation"), None),
            what="v2 in probation",
        )
        for n, how in enumerate(ATTACKS):
            version = f"{3 + n}"
            _attack(plane, tmp_path, how, version)
            wait_for(lambda v=version, h=how: _rejected(a, v, CODES[h]), 30, f"{how} v{version} reported rejected")
            assert a.orchestrator.journal.load(v2.id).state.value in ("probation", "committed"), (how, _journal(a))
            assert a.registry.models() == {"tiny": "2"}
        # nothing unverified was journaled, nothing superseded: v2's probation runs to its end and commits
        wait_for(lambda: a.orchestrator.journal.load(v2.id).terminal, 120, "v2's probation to end")
        assert _journal(a) == [("1", "committed"), ("2", "committed")]
        assert a.registry.models() == {"tiny": "2"}
        rejections = [e for e in a.events if e.get("event") == "rejected"]
        assert sorted(e["code"] for e in rejections) == sorted(CODES.values())
    finally:
        a.stop()


def test_attacks_on_a_first_deployment_keep_it_serving(tmp_path, mosquitto, plane):
    a = _agent(tmp_path, mosquitto, plane, probation_s=8)
    try:
        plane.to_device("tiny", plane.envelope(plane.manifest(_pkg(tmp_path, "1"), "tiny", "1")))
        wait_for(lambda: a.registry.models() == {"tiny": "1"}, what="v1 serving (probation)")
        for n, how in enumerate(ATTACKS):
            _attack(plane, tmp_path, how, f"{2 + n}")
        wait_for(lambda: _rejected(a, "5", "future-dated"), 30, "the last attack reported")
        assert a.registry.models() == {"tiny": "1"}
        wait_for(lambda: _journal(a) == [("1", "committed")], 60, "v1 committed, nothing else journaled")
        assert a.registry.models() == {"tiny": "1"}
    finally:
        a.stop()


@pytest.mark.parametrize("how", ["untrusted", "future"])
def test_a_hostile_group_envelope_never_blocks_device_pushes(tmp_path, mosquitto, plane, how):
    """A group envelope signed by an untrusted key, or a legitimate one issued 30 days ahead, with an issue time
    later than every device push: it is refused as such and device pushes go through."""
    a = _agent(tmp_path, mosquitto, plane, groups=("lab",))
    try:
        _attack(plane, tmp_path, how, "9", to="group")
        wait_for(lambda: _rejected(a, "9", CODES[how]), 30, "group envelope rejected")
        for version in ("1", "2"):
            plane.to_device("tiny", plane.envelope(plane.manifest(_pkg(tmp_path, version), "tiny", version)))
            wait_for(lambda v=version: (v, "committed") in _journal(a), what=f"v{version} committed")
        assert a.registry.models() == {"tiny": "2"}
        assert _journal(a) == [("1", "committed"), ("2", "committed")]
    finally:
        a.stop()


def test_a_future_dated_manifest_is_accepted_once_within_the_skew(tmp_path, mosquitto, plane):
    """The skew rule: an issue time up to MAX_SKEW_S ahead is accepted at once (clocks differ a little)."""
    from agent.lifecycle.desired import MAX_SKEW_S

    a = _agent(tmp_path, mosquitto, plane)
    try:
        m = plane.manifest(_pkg(tmp_path, "1"), "tiny", "1", issued=time.time() + MAX_SKEW_S / 2)
        plane.to_device("tiny", plane.envelope(m))
        wait_for(lambda: getattr(a.steps.slots.committed("tiny"), "version", None) == "1", what="v1 committed")
    finally:
        a.stop()
