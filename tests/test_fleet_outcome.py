"""The one device-outcome check: `fleet push --wait` and `fleet rollout` read a device's status the same way."""

from __future__ import annotations

from agent.fleet import rollout_state as rs
from agent.fleet.outcome import device_outcome, same_version
from agent.fleet.push import device_result


def _status(model_version=None, state="committed", dep=None, rejected=None, trust="verified"):
    doc = {"online": True, "models": {}, "deployments": {}, "trust": trust}
    if model_version is not None:
        doc["models"]["m"] = {"version": model_version, "state": state, "provider": "cpu"}
    if dep is not None:
        doc["deployments"]["m"] = dep
    if rejected is not None:
        doc["rejected"] = {"m": rejected}
    return doc


def test_versions_compare_numerically_in_push_and_rollout_alike():
    doc = _status("2.0")
    assert same_version("2", "2.0") and not same_version("2", "2.1") and not same_version(None, "2")
    assert device_result(doc, "m", "2", True)[0] == "committed"
    assert rs.observe(doc, "m", "2")[0] == rs.SUCCEEDED
    assert rs.holds(doc, "m", "2")
    assert same_version("beta", "beta") and not same_version("beta", "2")


def test_bad_terminal_records_fail_both_and_probation_is_pending():
    failed = _status("1", dep={"version": "2.0", "state": "failed", "result": "failed", "reason": "no provider"})
    assert device_result(failed, "m", "2", True) == ("failed", "no provider")
    assert rs.observe(failed, "m", "2") == (rs.FAILED, "failed: no provider")
    assert device_result(failed, "m", "2", False)[0] == "pending"  # an old record says nothing about this push
    probation = _status("2", state="probation", dep={"version": "2", "state": "probation", "result": None})
    assert device_outcome(probation, "m", "2")[0] == "pending"
    assert rs.observe(probation, "m", "2") == (None, None)


def test_a_rejection_before_the_lifecycle_counts_as_rejected():
    doc = _status("1", rejected={"version": "3", "code": "bad-signature", "reason": "bad-signature: ..."})
    assert device_result(doc, "m", "3", True)[0] == "rejected"
    assert rs.observe(doc, "m", "3")[0] == rs.FAILED
    assert device_outcome(doc, "m", "4")[0] == "pending"


def test_what_runs_wins_over_an_older_failure_of_the_same_version():
    doc = _status("2", dep={"version": "2", "state": "failed", "result": "failed", "reason": "x"})
    assert device_outcome(doc, "m", "2")[0] == "committed"
    assert rs.observe(doc, "m", "2")[0] == rs.SUCCEEDED


def test_only_a_verified_report_counts_as_success_or_failure():
    for trust in ("unsigned", "unregistered", "bad-signature", "unverified (no device registry)", None):
        good = _status("2", trust=trust)
        bad = _status("1", dep={"version": "2", "state": "failed", "result": "failed", "reason": "x"}, trust=trust)
        assert device_result(good, "m", "2", True) == ("pending", f"report {trust or 'not verified'}: not counted")
        assert device_result(bad, "m", "2", True)[0] == "pending"
        assert rs.observe(good, "m", "2") == (None, None) and rs.observe(bad, "m", "2") == (None, None)


def test_committed_only_after_probation_and_the_time_left_before():
    from agent.fleet.outcome import model_phase

    on = {"version": "2", "state": "probation", "probation_since": 100.0, "probation_s": 60.0, "probation_ends": 160.0}
    assert model_phase(on, now=118.0) == ("on probation", "on probation, 42 s left")
    assert model_phase({**on, "probation_ends": None}, now=118.0) == ("on probation", "on probation")
    assert model_phase(on, now=1000.0)[1] == "on probation, 0 s left"  # past the end, not yet reported committed
    assert model_phase({"version": "2", "state": "committed", "provider": "cpu"})[0] == "committed"
    assert model_phase({"version": "2", "state": "stale"})[0] == "committed"  # committed under other runtimes
    assert model_phase(None) == ("pending", "runs no version")
    status = {"trust": "verified", "models": {"m": on}, "deployments": {}}
    result, reason = device_outcome(status, "m", "2")
    assert result == "pending" and reason.startswith("on probation")


def test_a_version_rolled_back_because_it_was_not_judged_is_not_judged_not_failed():
    # serving.unjudged: rollback (the default): the device went back to the version judged before; the rollout holds
    # for an operator's word instead of counting the version as failed (agent.fleet.rollout_hold)
    counts = {"signal": "paired", "measured": 3, "needed": 16, "contended": 9, "requests": 400}
    dep = {"version": "2", "state": "rolled_back", "result": "rolled_back", "reason": "not judged; rolled back"}
    doc = _status("1", dep={**dep, "probation": {"not_judged": counts}})
    result, words = device_outcome(doc, "m", "2")
    assert result == "not judged" and words.startswith("rolled back to the version judged before, not judged: 3 of 16")
    plain = _status("1", dep=dep)  # rolled back for what the version did: a failure as before
    assert device_outcome(plain, "m", "2")[0] == "rolled_back"
