""" "Not judged" is its own outcome: probation says it with the counts, the target decides, fleets count it apart."""

from __future__ import annotations

from support.serving import log_model, open_session
from test_serving_probation import Clock

from agent.fleet import rollout_state as rs
from agent.fleet.outcome import COMMITTED, UNJUDGED, device_outcome
from agent.fleet.rollout_plan import RolloutSpec
from agent.lifecycle.status_doc import figures_brief
from agent.serving.registry import ModelRegistry
from agent.trial import unjudged
from agent.trial.probation import PASSED, TROUBLE, Baseline, Probation


class _Contended(Probation):
    """Probation's own logic over figures of a device that never had the cores (what rungate.py records when
    every run's threads waited): the runs came, were dropped as contended, a baseline was there."""

    def __init__(self, *args, measured: int, contended: int, **kw):
        super().__init__(*args, **kw)
        self._counts = (measured, contended)

    def figures(self, judge: bool = False) -> dict:
        f = super().figures(judge)
        f.update(compute_samples=self._counts[0], compute_contended=self._counts[1], requests=800)
        f["baseline"] = {"source": "incumbent", "version": "1"}
        f.pop("compute", None)
        f.pop("_slow", None)
        return f


def _probation(tmp_path, measured, contended):
    r = ModelRegistry()
    r.activate("m", "1", open_session(log_model(), tmp_path))
    clock = Clock()
    p = _Contended(r, "m", "1", {"p50": 1.0}, window=10, clock=clock, measured=measured, contended=contended)
    clock.now = 10.0 * p.thresholds.extend  # past the extension: the bound of "watch on and retry"
    return r, p


def test_probation_that_never_had_the_cores_says_not_judged_with_the_counts(tmp_path):
    r, p = _probation(tmp_path, measured=0, contended=797)
    v = p.evaluate()
    r.close()
    assert v.state == unjudged.NOT_JUDGED and v.state != PASSED
    assert v.figures["not_judged"] == {
        "signal": "compute",
        "measured": 0,
        "contended": 797,
        "needed": 64,
        "requests": 800,
        "incumbent_contended": 0,
    }
    assert "0 runs measured of the 64 needed, 797 dropped" in v.reason


def test_no_baseline_because_the_incumbents_runs_were_contended_says_not_judged(tmp_path):
    """The incumbent served 4096 runs before the swap but only 33 were measured (their threads waited), and there
    are no qualified figures: compute was not judged, and the verdict says so instead of passing."""
    r = ModelRegistry()
    r.activate("m", "1", open_session(log_model(), tmp_path))
    clock = Clock()
    inc = Baseline("incumbent", samples_s=tuple([0.001] * 33), rate=100.0, requests=4096, version="0")
    p = Probation(r, "m", "1", None, window=10, clock=clock, incumbent=inc)
    clock.now = 10.0 * p.thresholds.extend
    base = p._baseline(800, 100.0)
    assert base is None
    f = {"compute_samples": 0, "compute_contended": 44, "requests": 800, "baseline": p._baseline_figures(base)}
    r.close()
    assert f["baseline"] == {
        "source": None,
        "why": "only 33 of the incumbent's 4096 runs before the swap were measured (need 64); no qualified figures (or contended)",
        "contended": 4063,
    }
    assert unjudged.compute_unjudged(f, 64)
    counts = unjudged.compute_counts(f, 64)
    assert counts["incumbent_contended"] == 4063
    assert "no baseline: 4063 of the incumbent's runs before the swap were dropped" in unjudged.reason(
        "probation", counts
    )


def test_a_first_deployment_without_qualified_figures_is_not_flagged():
    """No incumbent and no qualified figures: nothing was contended, so no "not judged" flag (the usual pass)."""
    f = {"compute_samples": 0, "compute_contended": 0, "requests": 800, "baseline": {"source": None, "why": "x"}}
    assert not unjudged.compute_unjudged(f, 64)


def test_runs_skipped_for_another_reason_are_not_judged_never_passed(tmp_path):
    """800 requests, none measured, none contended (skipped for another reason): not judged, with the counts and
    why (issue 36: every skip reason ends as "not judged")."""
    r, p = _probation(tmp_path, measured=0, contended=0)
    v = p.evaluate()
    r.close()
    assert v.state == unjudged.NOT_JUDGED and v.state != PASSED
    n = v.figures["not_judged"]
    assert (n["measured"], n["contended"], n["needed"], n["requests"]) == (0, 0, 64, 800)
    assert n["why"] == "0 runs measured of the 64 needed"
    assert v.reason == "probation: compute time not judged: 0 runs measured of the 64 needed (800 requests)"
    status = _status(None)
    status["deployments"]["m"]["probation"]["not_judged"] = n
    result, reason = device_outcome(status, "m", "2")
    assert result == UNJUDGED and "(0 runs measured of the 64 needed)" in reason, reason
    brief = figures_brief(status["deployments"]["m"])
    assert "NOT JUDGED (0 of 64 runs measured, 0 contended: 0 runs measured of the 64 needed)" in brief, brief


def test_an_unjudged_version_is_rolled_back_by_default_and_committed_flagged_where_the_target_says():
    # issue 36: every shipped target rolls an unjudged version back to the one judged before
    got, why = unjudged.decide(unjudged.NOT_JUDGED, "probation: compute time not judged", {}, TROUBLE)
    assert got == TROUBLE and "rolled back to the version judged before" in why
    got, why = unjudged.decide(
        unjudged.NOT_JUDGED, "probation: compute time not judged", {"unjudged": "commit-flagged"}, TROUBLE
    )
    assert got == unjudged.NOT_JUDGED and "committed flagged" in why
    # a first deployment has nothing to go back to: it serves, flagged, and says why
    got, why = unjudged.decide(unjudged.NOT_JUDGED, "probation: compute time not judged", {}, TROUBLE, earlier=False)
    assert got == unjudged.NOT_JUDGED and "no earlier version to roll back to" in why


def test_the_target_may_roll_an_unjudged_version_back():
    got, why = unjudged.decide(
        unjudged.NOT_JUDGED, "probation: compute time not judged", {"unjudged": "rollback"}, TROUBLE
    )
    assert got == TROUBLE and why.endswith("serving.unjudged is rollback)")
    assert unjudged.decide(PASSED, "fine", {"unjudged": "rollback"}, TROUBLE) == (PASSED, "fine")


def _status(verdict: str | None) -> dict:
    probation = {"requests": 800, "errors": 0, "nonfinite": 0, "request_caused": 0, "baseline": {"source": "incumbent"}}
    if verdict == "not judged":
        probation.update(not_judged={"measured": 3, "needed": 64, "contended": 797})
    return {
        "trust": "verified",
        "models": {"m": {"version": "2", "state": "committed", "provider": "cpu"}},
        "deployments": {"m": {"version": "2", "state": "committed", "probation": probation}},
    }


def test_fleet_views_and_rollouts_count_unjudged_devices_apart():
    result, reason = device_outcome(_status("not judged"), "m", "2")
    assert result == UNJUDGED and "not judged: 3 of 64 runs measured, 797 contended" in reason
    assert device_outcome(_status(None), "m", "2")[0] == COMMITTED
    assert rs.observe(_status("not judged"), "m", "2")[0] == rs.NOT_JUDGED
    assert rs.observe(_status("passed"), "m", "2")[0] == rs.SUCCEEDED
    brief = figures_brief(_status("not judged")["deployments"]["m"])
    assert "NOT JUDGED (3 of 64 runs measured, 797 contended)" in brief


def test_a_rollout_can_halt_on_unjudged_devices():
    spec = RolloutSpec("m", "2", group="g", halt_on_unjudged=True).validate()
    assert RolloutSpec.from_dict(spec.to_dict()).halt_on_unjudged is True
    assert RolloutSpec("m", "2", group="g").halt_on_unjudged is False
