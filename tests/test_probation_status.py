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


def test_figures_brief_shows_the_paired_ratio_interval_and_aa_floor():
    paired = {
        "ratio": 2.06,
        "ci": [1.7, 2.15],
        "pairs": 32,
        "aa": {"ratio": 0.96, "ci": [0.85, 1.12], "pairs": 17},
        "conditions": {"psi_cpu_some_avg10": None, "psi_memory_some_avg10": None, "cpu_mhz": None, "note": "n"},
        "verdict": "slower",
        "reason": "r",
    }
    brief = figures_brief({"probation": {"requests": 9, "paired": paired}})
    assert "paired x2.06 [1.7, 2.15] over 32 pairs, A/A x0.96 [0.85, 1.12] over 17 pairs: slower" in brief
    few = {
        **paired,
        "ratio": 1.1,
        "ci": [None, None],
        "pairs": 3,
        "aa": {"ratio": None, "ci": [None, None], "pairs": 0},
    }
    assert "paired x1.1 (no interval) over 3 pairs, A/A not measured: not judged" in figures_brief(
        {"probation": {"requests": 9, "paired": {**few, "verdict": "not judged"}}}
    )
