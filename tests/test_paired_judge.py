"""The paired judge on synthetic pair logs (issue 36): a true 2x is decided "slower" while the host drifts between
pairs; equal compute is "not slower"; A/A pairs are never called slower; too few pairs and pairs that cannot
separate the versions say "not judged" with the counts; the host's conditions are read or said unavailable."""

from __future__ import annotations

import math

import numpy as np

from agent.trial import conditions
from agent.trial.pairjudge import NOT_JUDGED, NOT_SLOWER, SLOWER, PairedRule, judge, median_interval, sign_rank


def _pairs(rng: np.random.Generator, n: int, factor: float, noise: float = 0.08) -> tuple[list[float], float]:
    """Log ratios of n pairs whose halves share a drifting host speed (1x to 3x slower between pairs, as a
    co-runner that comes and goes), each with its own run-to-run noise; and the incumbent's median ms."""
    drift = rng.uniform(1.0, 3.0, n)
    inc = 2.0 * drift * rng.lognormal(0.0, noise, n)
    cand = factor * 2.0 * drift * rng.lognormal(0.0, noise, n)
    return list(np.log(cand / inc)), float(np.median(inc))


def test_the_sign_test_interval_covers_the_median_with_the_confidence_asked():
    assert sign_rank(7, 0.99) is None and sign_rank(8, 0.99) == 1  # 2 x 0.5^8 = 0.0078 <= 0.01
    iv = median_interval([math.log(v) for v in (1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0)], 0.99)
    assert iv.to_dict() == {"ratio": 4.4721, "ci": [1.0, 8.0], "pairs": 8}


def test_a_true_2x_is_slower_and_equal_compute_is_not():
    rng = np.random.default_rng(3)
    rule = PairedRule(factor=1.5)
    slow, inc_ms = _pairs(rng, 40, 2.0)
    aa, _ = _pairs(rng, 10, 1.0)
    said = judge(slow, aa, rule)
    assert said.verdict == SLOWER, said.reason
    assert 1.8 < said.candidate.ratio < 2.2 and said.candidate.lo > said.line and said.candidate.lo > said.aa.hi
    assert "paired compute ratio 2." in said.reason and "A/A floor" in said.reason
    same, inc_ms = _pairs(rng, 40, 1.0)
    said = judge(same, aa, rule)
    assert said.verdict == NOT_SLOWER and said.candidate.hi < said.line, said.reason


def test_aa_pairs_are_never_called_slower():
    rng = np.random.default_rng(11)
    rule = PairedRule(factor=1.5)
    verdicts = []
    for _ in range(1000):
        aa_as_candidate, inc_ms = _pairs(rng, 16, 1.0, noise=0.25)  # noisy: wide intervals, some straddle
        floor, _ = _pairs(rng, 8, 1.0, noise=0.25)
        verdicts.append(judge(aa_as_candidate, floor, rule).verdict)
    assert verdicts.count(SLOWER) == 0
    assert verdicts.count(NOT_SLOWER) > 500  # most are judged not slower; the rest say "not judged"


def test_too_few_pairs_or_no_floor_or_no_separation_is_not_judged_with_counts():
    rng = np.random.default_rng(5)
    rule = PairedRule(factor=1.5, min_pairs=16, min_aa=8)
    few, inc_ms = _pairs(rng, 10, 2.0)
    said = judge(few, [], rule)
    assert said.verdict == NOT_JUDGED and "10 candidate pairs, 0 A/A pairs" in said.reason and "need 16" in said.reason
    slow, inc_ms = _pairs(rng, 40, 2.0)
    said = judge(slow, [0.0] * 3, rule)
    assert said.verdict == NOT_JUDGED and "no A/A floor" in said.reason  # slower is never said without a floor
    wide = list(np.log(rng.choice([0.5, 3.0], 40)))  # pairs all over the place: the interval spans the line
    said = judge(wide, [0.0] * 10, rule)
    assert said.verdict == NOT_JUDGED and "cannot separate" in said.reason
    noisy_floor = [math.log(v) for v in (0.2, 0.5, 1.0, 2.5, 3.0, 4.0, 5.0, 6.0)]  # A/A reaching above 2x
    said = judge(slow, noisy_floor, rule)
    assert said.verdict == NOT_JUDGED and "does not clear the A/A floor" in said.reason


def test_conditions_are_read_or_said_unavailable(tmp_path):
    (tmp_path / "proc/pressure").mkdir(parents=True)
    (tmp_path / "proc/pressure/cpu").write_text("some avg10=12.50 avg60=3.00 avg300=1.00 total=5\n")
    for cpu, khz in ((0, 1200000), (1, 1800000)):
        d = tmp_path / f"sys/devices/system/cpu/cpu{cpu}/cpufreq"
        d.mkdir(parents=True)
        (d / "scaling_cur_freq").write_text(f"{khz}\n")
    got = conditions.read(str(tmp_path))
    assert got["psi_cpu_some_avg10"] == 12.5 and got["cpu_mhz"] == 1500.0
    assert got["psi_memory_some_avg10"] is None and "/proc/pressure/memory unavailable" in got["note"]
    bare = conditions.read(str(tmp_path / "nothing"))
    assert bare["psi_cpu_some_avg10"] is None and bare["cpu_mhz"] is None
    assert "cpu frequency unavailable" in bare["note"] and "/proc/pressure/cpu unavailable" in bare["note"]


def test_pairs_turn_to_aa_once_the_candidate_pairs_are_enough_and_the_floor_is_not(tmp_path):
    """A verdict waits on the A/A floor, not on more candidate pairs: with min_pairs candidate pairs and fewer
    than min_aa A/A pairs, every pair is A/A until the floor is there (real sessions, the real run gate)."""
    from support.serving import SINGLE_THREAD, log_model, open_session

    from agent.serving.rungate import RunGate
    from agent.trial.paired import Pairing

    inc, cand = (open_session(log_model(), tmp_path, f"{n}.onnx", SINGLE_THREAD) for n in ("inc", "cand"))
    pairing = Pairing(inc, cand, RunGate(), aa_share=0.0, seed=1)  # no A/A pair by chance
    pairing.needs = (4, 3)
    feeds = {"x": np.ones((1, 4), np.float32)}
    try:
        for _ in range(40):
            pairing.pair(feeds)
            if len(pairing.aa) >= 3:
                break
        assert len(pairing.pairs) == 4 and len(pairing.aa) == 3, pairing.counts()
        pairing.pair(feeds)  # the floor is there: back to candidate pairs (aa_share 0)
        assert len(pairing.aa) == 3
    finally:
        inc.close()
        cand.close()
