"""A `kind: agent` rollout's engine reading devices' release sections (agent.fleet.agent_release.model_view) as the
simulator's devices write them: real release roots, the guard's own link flips and roll back
(agent.sim.release_sim.SimulatedTrial), the section as the daemon reports it (agent.services.release_update).
No broker: the retained statuses are data, as in tests/test_rollout_plan.py."""

from __future__ import annotations

from pathlib import Path

from agent.fleet import rollout_state as rs
from agent.fleet.agent_release import RELEASE_NAME, ReleaseView, model_view
from agent.fleet.rollout import RolloutEngine, open_rollout
from agent.fleet.rollout_plan import RolloutSpec
from agent.services.release_update import ReleaseUpdater
from agent.sim.release_sim import SimulatedTrial, lay_out


class _Device:
    """A simulated device's release root at 1.0.0, 1.1.0 installed beside it; trials as the simulator runs them."""

    def __init__(self, tmp: Path, dev: str):
        from agent_guard import links

        self.dev, self.root, self.state_dir = dev, tmp / dev / "release-root", tmp / dev
        lay_out(self.root, "1.0.0")
        links.write_json(self.root / "releases" / "1.1.0" / "installed.json", {"version": "1.1.0", "simulated": True})
        self.updater = ReleaseUpdater(
            self.root, self.state_dir, SimulatedTrial(lambda v: False), trusted=dict, fetch=lambda m: Path()
        )

    def trial(self, version: str, fails: bool) -> None:
        SimulatedTrial(lambda v: fails, trial_s=0.0).trial(self.root, version)

    def start(self, version: str) -> dict:
        """N+1 up and its trial under way (the guard's steps so far), as SimulatedTrial leaves it mid-trial."""
        from agent_guard import links
        from agent_guard.trial import step

        doc = {"version": version, "from": links.target(self.root, links.CURRENT), "started": 1.0, "try": 1}
        links.flip(self.root, version)
        step(self.root, doc, "starting")
        return doc

    def fail(self, doc: dict) -> None:
        from agent.sim.release_sim import FAIL_REASON, _InProcess
        from agent_guard.trial import Limits, roll_back

        roll_back(self.root, _InProcess(), doc, FAIL_REASON, Limits())

    def status(self) -> dict:
        sec = self.updater.section()
        return {"device_id": self.dev, "online": True, "trust": "verified", "groups": ["lab"], "target": "t",
                "providers": ["cpu"], "models": {}, "deployments": {}, "agent_version": sec["current"],
                "agent_release": sec}  # fmt: skip


class _Fleet:
    def __init__(self, devices: dict[str, _Device]):
        self.devices, self.desired = devices, {}

    def statuses(self):
        return {dev: d.status() for dev, d in self.devices.items()}

    def wait_change(self, timeout):
        return False

    def publish_desired(self, dev, model, env):
        self.desired[dev] = env

    def publish_progress(self, rid, doc):
        return None


class _Issuer:
    def envelope(self, dev, version, rollback):
        return {"version": version, "rollback": rollback}


def test_a_device_whose_own_trial_fails_after_the_halt_is_cancelled_not_rolled_back(tmp_path):
    """The guard's flip back leaves `previous` naming the failed N+1; the engine must not read that as 'took N+1,
    then went back' (a second `rolled_back` in the halted cohort, seen on a loaded host). The canary, whose trial
    passed and which the halt sent back to N, is the one rolled back."""
    devices = {dev: _Device(tmp_path, dev) for dev in ("d-0", "d-1", "d-2")}
    fleet = _Fleet(devices)
    spec = RolloutSpec(RELEASE_NAME, "1.1.0", group="lab", canary="1", wave_size="2", max_failures="0%")
    population = {dev: model_view(doc) for dev, doc in fleet.statuses().items()}
    state, _ = open_rollout(tmp_path / "store", spec.validate(), population, {"sha256": "ab" * 32})
    assert {d["previous_version"] for d in state["devices"].values()} == {"1.0.0"}
    eng = RolloutEngine(tmp_path / "store", state, ReleaseView(fleet), _Issuer())
    eng.step()
    assert set(fleet.desired) == {"d-0"}  # the canary
    devices["d-0"].trial("1.1.0", fails=False)
    eng.step()
    assert state["devices"]["d-0"]["result"] == rs.SUCCEEDED and set(fleet.desired) == {"d-0", "d-1", "d-2"}
    in_flight = devices["d-2"].start("1.1.0")  # its trial under way (on probation, as the engine reads it)
    devices["d-1"].trial("1.1.0", fails=True)  # the wave's first failure halts the cohort; d-2 is in flight
    eng.step()
    assert state["devices"]["d-1"]["result"] == rs.FAILED and state["devices"]["d-2"]["result"] == rs.ROLLBACK_PENDING
    devices["d-2"].fail(in_flight)  # its own trial, asked before the halt, fails too: the guard flips back to N
    devices["d-0"].trial("1.0.0", fails=False)  # the canary goes back to N: a trial of N
    doc = fleet.statuses()["d-2"]
    assert doc["agent_release"]["previous"] == "1.1.0"  # the release root as the guard left it
    assert "previous" not in model_view(doc)["models"][RELEASE_NAME], model_view(doc)
    assert model_view(fleet.statuses()["d-0"])["models"][RELEASE_NAME]["previous"] == "1.1.0"
    eng.step()
    results = {dev: d["result"] for dev, d in state["devices"].items()}
    assert results == {"d-0": rs.ROLLED_BACK, "d-1": rs.FAILED, "d-2": rs.CANCELLED}, state["devices"]
    assert "which failed there too (failed: trial: simulated: wrong answer" in state["devices"]["d-2"]["reason"]
    assert [c["state"] for c in state["cohorts"].values()] == [rs.HALTED], state["cohorts"]


def test_the_section_never_pairs_a_release_with_a_trial_read_across_a_flip(tmp_path):
    """`current` and the trial are read as one: a flip back between the two reads (the failed trial ending) would
    pair N+1 with its own failed report, which the engine reads as N+1 committed."""
    from agent_guard import links

    dev = _Device(tmp_path, "d-0")
    dev.trial("1.1.0", fails=True)
    links.flip(dev.root, "1.1.0")  # as the guard had it while the trial ran: N+1 current
    reads = []
    real = dev.updater._current

    def current_then_flip_back():  # the trial thread's flip back lands right after the first read
        reads.append(real())
        if len(reads) == 1:
            links.flip_back(dev.root, "1.1.0", "1.0.0")
        return reads[-1]

    dev.updater._current = current_then_flip_back  # type: ignore[method-assign]
    sec = dev.updater.section()
    assert reads[0] == "1.1.0" and sec["current"] == "1.0.0", (reads, sec)
    model = model_view({"trust": "verified", "agent_release": sec})["models"][RELEASE_NAME]
    assert model["version"] == "1.0.0", model
