"""Rollout planning and the engine's decisions, driven by retained-status documents (no broker needed)."""

from __future__ import annotations

import pytest

from agent.errors import ConfigError
from agent.fleet import rollout_state as rs
from agent.fleet.rollout import RolloutEngine, open_rollout
from agent.fleet.rollout_plan import Count, RolloutSpec, parse_count, plan, split_waves


def _status(dev, target, providers, groups=("lab",), version=None, online=True):
    doc = {
        "device_id": dev,
        "online": online,
        "groups": list(groups),
        "target": target,
        "providers": providers,
        "models": {},
        "deployments": {},
        "trust": "verified",  # as the control plane's registry left it
    }
    if version:
        doc["models"]["m"] = {"version": version, "state": "committed", "provider": providers[0]}
    return doc


def _fleet():
    st = {f"pi-{i}": _status(f"pi-{i}", "raspberry-pi-5", ["cpu"], version="1") for i in range(6)}
    st.update({f"nuc-{i}": _status(f"nuc-{i}", "intel-nuc", ["openvino", "cpu"], version="1") for i in range(4)})
    st["other"] = _status("other", "raspberry-pi-5", ["cpu"], groups=("prod",))
    return st


def test_parse_count_and_resolution():
    assert parse_count("3", "--canary") == Count(3, False)
    assert parse_count("10%", "--canary").of(3) == 1  # rounds up, never 0 for a non-zero percentage
    assert parse_count("0", "--canary").of(10, at_least_one=False) == 0
    assert parse_count("50%", "--wave-size").of(5) == 3
    for bad in ("-1", "x", "150%", "1.5", ""):
        with pytest.raises(ConfigError, match="--canary"):
            parse_count(bad, "--canary")
    with pytest.raises(ConfigError, match="more than 0"):
        parse_count("0", "--wave-size", allow_zero=False)


def test_split_waves_canary_then_waves():
    ids = [f"d{i}" for i in range(10)]
    assert split_waves(ids, Count(1, False), Count(4, False)) == [["d0"], ids[1:5], ids[5:9], ids[9:]]
    assert split_waves(ids, Count(0, False), Count(50, True)) == [ids[:5], ids[5:]]


def test_plan_selects_group_and_cohorts_by_target_and_provider():
    st = _fleet()
    p = plan(RolloutSpec("m", "2", group="lab", cohort_by="target", canary="1", wave_size="50%").validate(), st)
    assert set(p["cohorts"]) == {"raspberry-pi-5", "intel-nuc"}
    assert "other" not in p["devices"]
    pi = p["cohorts"]["raspberry-pi-5"]["waves"]
    assert len(pi[0]) == 1 and sum(map(len, pi)) == 6
    assert p["devices"]["pi-0"]["previous_version"] == "1"
    p2 = plan(RolloutSpec("m", "2", group=None, cohort_by="provider").validate(), st)
    assert set(p2["cohorts"]) == {"cpu", "openvino"} and len(p2["devices"]) == 11


def test_plan_rejects_empty_selection_and_bad_spec():
    with pytest.raises(ConfigError, match="no devices in group 'nope'"):
        plan(RolloutSpec("m", "2", group="nope").validate(), _fleet())
    with pytest.raises(ConfigError, match="--version"):
        RolloutSpec("m", "v2").validate()
    with pytest.raises(ConfigError, match="--cohort-by"):
        RolloutSpec("m", "2", cohort_by="board").validate()
    with pytest.raises(ConfigError, match="--name"):
        RolloutSpec("../m", "2").validate()


class _Fleet:
    """Retained statuses as data; publishing records the desired state each device was given."""

    def __init__(self, statuses):
        self.st, self.desired, self.progress = statuses, {}, {}

    def statuses(self):
        return {k: dict(v) for k, v in self.st.items()}

    def wait_change(self, timeout):
        return False

    def publish_desired(self, dev, model, env):
        self.desired[dev] = env

    def publish_progress(self, rid, doc):
        self.progress[rid] = doc

    def report(self, dev, version, ok=True, reason="accuracy: max_rel 0.3 > 0.05"):
        doc = self.st[dev]
        if ok:
            doc["models"]["m"] = {"version": version, "state": "committed", "provider": doc["providers"][0]}
            doc["deployments"]["m"] = {"version": version, "state": "committed", "result": "committed"}
        else:
            doc["deployments"]["m"] = {"version": version, "state": "failed", "result": "failed", "reason": reason}


class _Issuer:
    def envelope(self, dev, version, rollback):
        return {"manifest": {"name": "m", "version": version, "rollback": rollback}}


def _engine(tmp_path, fleet, **kw):
    spec = RolloutSpec("m", "2", group="lab", **kw)
    state, resumed = open_rollout(tmp_path, spec, fleet.statuses(), {"sha256": "ab" * 32})
    return RolloutEngine(tmp_path, state, fleet, _Issuer()), resumed


def test_engine_halts_failing_cohort_at_canary_and_rolls_back(tmp_path):
    fleet = _Fleet(_fleet())
    eng, _ = _engine(tmp_path, fleet, cohort_by="target", canary="1", wave_size="2")
    assert not eng.step()
    canaries = set(fleet.desired)
    assert canaries == {"pi-0", "nuc-0"}
    fleet.report("nuc-0", "2")
    fleet.report("pi-0", "2", ok=False)
    eng.step()
    pi = eng.state["cohorts"]["raspberry-pi-5"]
    assert pi["state"] == rs.HALTED and "pi-0: failed: accuracy" in pi["reason"]
    assert fleet.desired["pi-0"]["manifest"] == {"name": "m", "version": "1", "rollback": True}  # desired restored
    assert all(eng.state["devices"][f"pi-{i}"]["result"] == rs.NOT_REACHED for i in range(1, 6))
    assert not any(f"pi-{i}" in fleet.desired for i in range(1, 6))  # never reached the rest of the cohort
    for _ in range(3):  # the nuc cohort keeps going, wave by wave
        for dev in [d for d, e in fleet.desired.items() if d.startswith("nuc") and e["manifest"]["version"] == "2"]:
            fleet.report(dev, "2")
        eng.step()
    assert eng.state["cohorts"]["intel-nuc"]["state"] == rs.COMPLETED
    assert eng.state["state"] == rs.PARTIAL
    summary = rs.summary(eng.state)
    assert {d["device_id"]: d["result"] for d in summary["devices"]}["pi-0"] == rs.FAILED


def test_engine_rolls_back_devices_that_took_the_version_and_resumes_from_disk(tmp_path):
    fleet = _Fleet(_fleet())
    eng, resumed = _engine(tmp_path, fleet, canary="2", wave_size="4", max_failures="20%")
    assert not resumed
    eng.step()
    first = sorted(fleet.desired)
    for dev in first:
        fleet.report(dev, "2")
    eng.step()  # canary passed: wave 1 published
    wave1 = sorted(set(fleet.desired) - set(first))
    assert len(wave1) == 4
    # The control plane restarts: the same spec resumes from disk and republishes the wave in flight.
    fleet2 = _Fleet(fleet.st)
    eng2, resumed = _engine(tmp_path, fleet2, canary="2", wave_size="4", max_failures="20%")
    assert resumed
    eng2.republish()
    assert sorted(fleet2.desired) == wave1
    fleet2.report(wave1[0], "2")
    for dev in wave1[1:3]:
        fleet2.report(dev, "2", ok=False)
    eng2.step()  # 2 failed of 6 attempted > 20%: halt, roll back what took the version
    assert eng2.state["cohorts"]["all"]["state"] == rs.ROLLING_BACK
    took = [*first, wave1[0]]
    assert all(
        fleet2.desired[d]["manifest"]["version"] == "1" and fleet2.desired[d]["manifest"]["rollback"] for d in took
    )
    for dev in took:
        fleet2.report(dev, "1")
    assert eng2.step()
    results = {d["device_id"]: d["result"] for d in rs.summary(eng2.state)["devices"]}
    assert all(results[d] == rs.ROLLED_BACK for d in took)
    assert results[wave1[3]] == rs.CANCELLED  # in flight at the halt, stayed on 1
    assert eng2.state["state"] == rs.HALTED


def test_silent_devices_fail_at_deadline(tmp_path):
    fleet = _Fleet(_fleet())
    now = [1000.0]
    spec = RolloutSpec("m", "2", group="lab", canary="1", deadline_s=60)
    state, _ = open_rollout(tmp_path, spec, fleet.statuses(), {"sha256": "cd" * 32})
    eng = RolloutEngine(tmp_path, state, fleet, _Issuer(), clock=lambda: now[0])
    eng.step()
    now[0] += 61
    eng.step()
    dev = next(iter(fleet.desired))
    assert eng.state["devices"][dev]["result"] == rs.FAILED
    assert "silent: no result within 60 s" in eng.state["devices"][dev]["reason"]


def test_an_unverified_report_is_shown_but_neither_fails_nor_passes_a_wave(tmp_path):
    fleet = _Fleet(_fleet())
    now, seen = [1000.0], []
    spec = RolloutSpec("m", "2", group="lab", canary="1", deadline_s=60)
    state, _ = open_rollout(tmp_path, spec, fleet.statuses(), {"sha256": "cd" * 32})
    eng = RolloutEngine(
        tmp_path, state, fleet, _Issuer(), progress=lambda e, **f: seen.append((e, f)), clock=lambda: now[0]
    )
    eng.step()
    (dev,) = fleet.desired
    fleet.report(dev, "2", ok=False)
    fleet.st[dev]["trust"] = "unsigned"  # a forged failure: shown, never counted
    eng.step()
    d = eng.state["devices"][dev]
    assert d["result"] == rs.IN_PROGRESS and d["reason"] == "report unsigned: not counted"
    assert eng.state["cohorts"]["all"]["state"] == rs.RUNNING
    assert ("device", {"device_id": dev, "cohort": "all", "result": rs.IN_PROGRESS, "reason": d["reason"]}) in seen
    fleet.report(dev, "2")  # a forged success does not pass the canary either
    eng.step()
    assert eng.state["devices"][dev]["result"] == rs.IN_PROGRESS
    fleet.st[dev]["trust"] = "verified"  # the device's own signed report does
    eng.step()
    assert eng.state["devices"][dev]["result"] == rs.SUCCEEDED


def test_resume_with_other_settings_is_refused(tmp_path):
    fleet = _Fleet(_fleet())
    _engine(tmp_path, fleet, canary="1")
    with pytest.raises(ConfigError, match="already exists .* other settings"):
        _engine(tmp_path, fleet, canary="3")


def test_devices_that_never_took_the_version_get_their_old_desired_state_back(tmp_path):
    fleet = _Fleet(_fleet())
    spec = RolloutSpec("m", "2", group="lab", cohort_by="target", canary="1", wave_size="2")

    def extras(planned):
        for dev, d in planned["devices"].items():
            d["previous_desired"] = '{"old": "' + dev + '"}' if dev.startswith("pi") else None
        return {}

    state, _ = open_rollout(tmp_path, spec, fleet.statuses(), {"sha256": "ef" * 32}, extras=extras)
    eng = RolloutEngine(tmp_path, state, fleet, _Issuer())
    eng.step()
    fleet.report("pi-0", "2", ok=False)
    fleet.report("nuc-0", "2", ok=False)
    eng.step()
    assert fleet.desired["pi-0"] == b'{"old": "pi-0"}'  # the same bytes as before: nothing new to deploy
    assert fleet.desired["nuc-0"] is None  # it had no device-specific desired state: cleared again
    assert rs.load_state(tmp_path, "m-2")["devices"]["pi-0"]["desired_restored"] is True


def test_provider_cohort_falls_back_to_the_provider_serving_the_model():
    st = _fleet()
    st["pi-0"]["providers"] = []
    st["nuc-0"]["providers"] = []
    st["nuc-0"]["models"]["m"]["provider"] = "openvino"
    p = plan(RolloutSpec("m", "2", group="lab", cohort_by="provider").validate(), st)
    assert p["devices"]["pi-0"]["cohort"] == "cpu" and p["devices"]["nuc-0"]["cohort"] == "openvino"
