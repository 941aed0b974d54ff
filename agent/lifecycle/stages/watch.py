"""The lifecycle's side of shadow and probation: when to shadow, the incumbent's baseline, the verdicts."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment
from agent.trial import unjudged
from agent.trial.paired import Pairing, rule_of
from agent.trial.probation import CPU, PASSED, TROUBLE, Baseline, Probation, compute_measure, incumbent_baseline
from agent.trial.settings import ProbationConfig, ShadowConfig
from agent.trial.shadow import FAIL, Shadow, skipped
from agent.trial.twin import CANDIDATE, INCUMBENT, Twin


class ShadowFailed(LifecycleError):
    """The candidate failed its shadow phase: no client saw it."""

    def __init__(self, figures: dict[str, Any]):
        super().__init__(figures["reason"])
        self.figures = figures


def shadow_skip_reason(registry: Any, name: str, swap: str, config: ShadowConfig) -> str | None:
    """Why no shadow phase runs for this activation (None: it runs)."""
    if not config.enabled:
        return "serving.shadow.enabled is false"
    if swap != "make-before-break":
        return f"{swap} swap: memory does not allow two sessions"
    if name not in registry.models():
        return "no incumbent serving (first deployment)"
    return None


class Rehearsal:
    """One activation's shadow phase and the incumbent's baseline: its runs over baseline_s up to the swap (the
    shadow phase included, where one runs)."""

    def __init__(
        self, registry: Any, name: str, shadow: ShadowConfig, probation: ProbationConfig, window_s: float, measure: str
    ):
        self.registry, self.name, self.measure = registry, name, measure
        self.shadow_config, self.probation_config, self.window_s = shadow, probation, window_s
        self.figures: dict[str, Any] | None = None
        self.baseline: Baseline | None = None
        self.pairing: Pairing | None = None  # the shadow phase's pairs, carried into probation
        # builds a twin of the incumbent (serving during the shadow phase) for the pairs: (sha256, build) or None
        self.incumbent_twin: tuple[str, Callable[[], Any]] | None = None
        self.candidate_twin: Callable[[], Any] | None = None  # ... and of the candidate (serving on probation)
        self.earlier = True  # a committed version to roll back to (False on a first deployment: serving.unjudged)

    def skip(self, reason: str) -> None:
        self.figures = skipped(reason)

    def take_baseline(self, until: float | None = None) -> None:
        """The incumbent's compute times over baseline_s up to `until` (perf_counter(); None: its last run)."""
        incumbent = self.registry.models().get(self.name)
        window = self.probation_config.baseline_s
        self.baseline = incumbent_baseline(self.registry, self.name, incumbent, window, until, self.measure)

    def before_swap(self, ctx: StepContext) -> Callable[[Any], None]:
        """The callback serve.activate runs between warm-up and swap."""

        def run(session: Any) -> None:
            incumbent = self.registry.models().get(self.name)
            self.take_baseline(time.perf_counter())  # any live traffic to shadow?
            if self.figures is None and self.baseline is not None and not self.baseline.requests:
                window = self.probation_config.baseline_s
                self.figures = skipped(f"no live traffic to shadow (no request in the last {window:g} s)")
            if self.figures is None:
                self.figures = self._shadow(session, ctx, incumbent)
                # The incumbent's runs beside the candidate's shadow runs, measured alone like them, are the
                # baseline's closest to the candidate's conditions: the window ends where the shadow ends.
                self.take_baseline(time.perf_counter())
                if self.figures["verdict"] == FAIL:
                    raise ShadowFailed(self.figures)

        return run

    def _shadow(self, session: Any, ctx: StepContext, incumbent: str | None) -> dict[str, Any]:
        shadow = Shadow(session, self.shadow_config, cpu=self.measure == CPU, gate=self.registry.gate)
        stats = self.registry.model_stats(self.name, incumbent)
        stats.watch(True)  # every incumbent response is sampled (CPU time measured) while the shadow runs
        self.registry.observe(self.name, shadow)
        twin = None
        if self.incumbent_twin is not None and self.incumbent_twin[0] == self.registry.entry(self.name).meta.get(
            "sha256"
        ):
            twin = Twin(INCUMBENT, self.incumbent_twin[1], self.registry.gate)
        config = self.probation_config
        pairing = self.pairing = _pairing(self.registry, self.name, session, config, self.measure, twin=twin)
        try:
            ctx.report("shadow", phase="started", version_serving=incumbent)
            figures = shadow.run(ctx.check)
        finally:
            stats.watch(False)
            for observer in (shadow, pairing):
                if observer is not None:
                    _stop_observing(self.registry, self.name, observer)
        if pairing is not None:  # enough pairs decide compute here; else reported, and judged in probation
            paired = pairing.result(rule_of(self.probation_config))
            enough = paired["pairs"] >= self.probation_config.paired_min_pairs
            figures = shadow.result(paired) if enough else {**figures, "paired": paired}
        ctx.report("shadow", phase="done", **figures)
        return figures


def _pairing(
    registry: Any,
    name: str,
    candidate: Any,
    config: ProbationConfig,
    measure: str,
    incumbent: Any = None,
    twin: Twin | None = None,
) -> Pairing | None:
    """Paired timing of `candidate` against the incumbent (the serving session, or `incumbent`), observing the
    serving version's live requests, the served side timed on `twin` (trial/twin.py) where one is given and
    serving.probation.paired_twin is on; None when serving.probation.paired is off."""
    if not config.paired:
        return None
    twin = twin if config.paired_twin else None
    inc = incumbent if incumbent is not None else registry.entry(name).session
    pairing = Pairing(
        inc,
        candidate,
        registry.gate,
        share=config.paired_share,
        aa_share=config.paired_aa_share,
        cpu=measure == CPU,
    )
    pairing.twin = twin
    pairing.needs = (config.paired_min_pairs, config.paired_min_aa)
    registry.observe(name, pairing)
    return pairing.start()


def start_pairing(
    registry: Any,
    name: str,
    config: ProbationConfig,
    measure: str,
    carried: Pairing | None = None,
    twin_build: Callable[[], Any] | None = None,
) -> Pairing | None:
    """Paired timing of the serving version (timed on a twin that `twin_build` opens, where given) against the
    referee (the incumbent kept through the swap), with the shadow phase's pairs (`carried`: taken on the same
    two sessions, or with the served side on a twin in both phases); None when it is off or there is no referee."""
    ref = registry.referee_session(name) if config.paired else None
    if ref is None:
        return None
    twin = Twin(CANDIDATE, twin_build, registry.gate) if twin_build is not None else None
    pairing = _pairing(registry, name, registry.entry(name).session, config, measure, ref[1], twin)
    if pairing is not None and carried is not None and _same_conditions(carried, pairing, ref[1]):
        pairing.carry(carried)
    return pairing


def _same_conditions(carried: Pairing, pairing: Pairing, referee: Any) -> bool:
    """Were the shadow phase's pairs taken as probation's are? On the same two sessions, or with the served
    side (the incumbent then, the candidate now) on a twin in both phases."""
    if pairing.twin is None:
        return carried.twin is None and carried.incumbent is referee
    return carried.twin is not None and carried.twin.side == INCUMBENT and carried.twin.error is None


def _stop_observing(registry: Any, name: str, observer: Any) -> None:
    try:
        registry.observe(name, observer, on=False)
    except Exception:  # noqa: BLE001 - the version went away meanwhile: nothing to detach
        pass
    if isinstance(observer, Pairing):
        observer.stop()


def probation_watch(
    registry: Any,
    dep: Deployment,
    ctx: StepContext,
    window: float,
    config: ProbationConfig,
    rehearsal: Rehearsal | None,
    serving: dict[str, Any] | None = None,
) -> tuple[str, str, dict[str, Any]]:
    """Watch the new version for `window` seconds; (state, reason, figures). The referee (the incumbent's
    session kept through the swap) is closed when it passes; otherwise the rollback serves it again
    (restore.ensure_committed: no build)."""
    sel = dep.data.get("selected") or {}
    lat = sel.get("latency_ms") or {}
    qualified = None if (sel.get("contended") or lat.get("contended")) else lat  # contended: no baseline
    measure = compute_measure(sel.get("provider"), sel.get("device"))
    incumbent = rehearsal.baseline if rehearsal is not None else None
    carried, twin_build = (rehearsal.pairing, rehearsal.candidate_twin) if rehearsal else (None, None)
    pairing = start_pairing(registry, dep.model, config, measure, carried, twin_build)
    try:
        watch = Probation(
            registry,
            dep.model,
            dep.version,
            qualified,
            window=window,
            thresholds=config,
            incumbent=incumbent,
            measure=measure,
            pairing=pairing,
        )
        watch.start()
        try:
            while not watch.done:
                ctx.check()
                watch.wait(0.2)
        finally:
            watch.stop()
    finally:
        if pairing is not None:  # done with both sessions before the referee is dropped or serves again
            _stop_observing(registry, dep.model, pairing)
    v = watch.verdict
    earlier = rehearsal.earlier if rehearsal is not None else registry.referee_session(dep.model) is not None
    state, reason = unjudged.decide(v.state, v.reason, serving, TROUBLE, earlier)  # the target decides "not judged"
    if state in (PASSED, unjudged.NOT_JUDGED):
        registry.drop_referee(dep.model)  # committed: the incumbent's session is not needed any more
    if state not in (TROUBLE, PASSED, unjudged.NOT_JUDGED):
        raise LifecycleError(v.reason)
    return state, reason, v.figures  # "not judged": the figures carry not_judged (its counts)
