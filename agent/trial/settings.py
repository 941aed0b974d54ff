"""The trial's settings (agent.yaml serving.probation and serving.shadow): frozen, with their defaults. The config
reads and validates them (agent.config.sections); the trial owns what they mean."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ProbationConfig:
    """serving.probation: how a fresh version is judged after its swap (docs/serving.md, Probation)."""

    max_errors: int = 0  # runtime failures blamed on the version, tolerated in the window
    max_nonfinite: int = 0  # NaN/Inf outputs blamed on the version, tolerated in the window
    ratio: float = 1.5  # a compute-time quantile may reach ratio x the incumbent's ...
    slack_ms: float = 0.5  # ... plus this (scheduler noise dominates sub-ms models)
    quantiles: tuple[int, ...] = (50, 90)  # judged against the incumbent (99 needs p99_samples per side)
    alpha: float = 0.01  # one-sided binomial test: "slower" only when p < alpha
    p90_samples: int = 64  # samples per side before a quantile below 99 is judged (field notes: 64 for a p90)
    p99_samples: int = 662  # ... and before a p99 is (field notes: 662)
    rate_tolerance: float = 4.0  # request rates within this factor of each other are comparable
    baseline_s: float = 60.0  # the incumbent's compute times in this window before the swap are the baseline
    qualified_factor: float = 3.0  # no incumbent: qualified quantile x this + slack_ms
    qualified_quantiles: tuple[int, ...] = (50,)  # no incumbent: judged on these only (tails inflate under load)
    min_requests: int = 0  # requests needed to pass; 0: a quiet window passes
    # too few runs measured for a compute verdict when the window ends (the runs' threads waited for the cores,
    # rungate.py): watch on until there are, up to this many times the window; 1: never
    extend: float = 3.0
    referee: bool = True  # make-before-break: keep the incumbent's session until the verdict, to re-run inputs
    # Paired timing (trial/paired.py, pairjudge.py): with the referee kept, copies of live requests run on both
    # versions back to back; the pairs' median log ratio and its interval decide compute time.
    paired: bool = True
    paired_share: float = 0.10  # mirrored runs' CPU at most this share of the serving CPU
    paired_aa_share: float = 0.2  # this share of pairs is incumbent against incumbent (the noise floor)
    paired_min_pairs: int = 16  # candidate pairs before a verdict
    paired_min_aa: int = 8  # A/A pairs before "slower"
    paired_confidence: float = 0.99  # of the sign-test intervals
    # time the served side of a pair on a second session the clients never run (trial/twin.py): one more copy
    # of the model in memory during the trial
    paired_twin: bool = True


@dataclass(frozen=True)
class ShadowConfig:
    """serving.shadow: before the swap the candidate answers copies of live requests (docs/serving.md, Shadow)."""

    enabled: bool = True  # skipped anyway where the swap is stop-then-start or no incumbent serves
    requests: int = 200  # the phase ends after this many compared requests ...
    duration_s: float = 30.0  # ... or after this long
    min_requests: int = 20  # fewer compared requests: verdict inconclusive (the deployment goes on)
    cpu_share: float = 0.05  # of one core: the shadow runs at most this fraction of the time
    min_agreement: float = 0.9  # top-1 agreement of classifier outputs below this: fail
    max_rel: float | None = None  # max_rel of other float outputs above this: fail (None: reported only)
    max_failures: int = 0  # candidate failures or NaN/Inf where the incumbent answered finite values
    max_latency_ratio: float = 3.0  # candidate / incumbent compute time (medians) above this ...
    slack_ms: float = 0.5  # ... and above max_latency_ratio x the incumbent's + this: fail (as probation's)
