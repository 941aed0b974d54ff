"""The shadow and probation figures in a deployment summary read in a few words (status, fleet status)."""

from __future__ import annotations

from agent.lifecycle.status_doc import figures_brief


def test_figures_brief_names_the_verdicts_and_ratios():
    dep = {
        "shadow": {"requests": 60, "agreement": 0.705, "max_rel": 0.9, "latency_ratio": 1.02, "verdict": "fail"},
        "probation": {
            "requests": 812,
            "errors": 0,
            "nonfinite": 0,
            "request_caused": 6,
            "baseline": {"source": "incumbent"},
            "compute": [{"q": 50, "ratio": 2.08}, {"q": 90, "ratio": 2.43}],
        },
    }
    brief = figures_brief(dep)
    assert "shadow fail (60 req, agreement 0.705, compute x1.02)" in brief
    assert "6 request-caused" in brief and "p50 x2.08, p90 x2.43 vs incumbent" in brief
    assert figures_brief({"shadow": {"verdict": "skipped", "requests": 0}}) == ""
    assert figures_brief({}) == ""
