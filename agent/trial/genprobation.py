"""Probation of a generative version (docs/generative.md, "Swap and probation"): after the swap the new version
serves while the incumbent is kept loaded (the referee); the prompts of its live generations are run again on
both, back to back (genpaired.TokenPairing), and the paired TPOT ratio decides, with the same verdict rules as an
ordinary model's pairs (probation.paired_verdict): slower is trouble (the deployment rolls back), not slower
passes, not judged watches on up to `extend` windows and is then its own outcome."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

from agent.trial.genpaired import TokenPairing
from agent.trial.paired import rule_of
from agent.trial.probation import PASSED, SUPERSEDED, WATCHING, Verdict, paired_verdict
from agent.trial.settings import ProbationConfig
from agent.trial.twin import CANDIDATE, INCUMBENT, Twin

COUNTED = ("requests_total", "cancelled_total", "refused_total", "prompt_tokens_total", "completion_tokens_total")


def start_pairing(host: Any, name: str, config: ProbationConfig, cpu: bool) -> TokenPairing | None:
    """Paired TPOT of the serving version against the referee (the incumbent kept through the swap), observing
    the serving version's live generations; with serving.probation.paired_twin on, the serving side is timed on a
    pair copy of it (GenerativeHost.copy, trial/twin.py), and so is the referee where the runtime's pipelines share
    a thread pool (openvino-genai); None when serving.probation.paired is off or there is no referee."""
    ref, serving = host.referee(name), host.models.get(name)
    if not config.paired or ref is None or serving is None:
        return None
    pairing = TokenPairing(ref, serving, share=config.paired_share, aa_share=config.paired_aa_share, cpu=cpu)
    pairing.needs = (config.paired_min_pairs, config.paired_min_aa)
    if config.paired_twin:  # built on the pair thread before its first pair
        pairing.twin = Twin(CANDIDATE, partial(host.copy, serving))
        if serving.shared_pool:
            pairing.referee_twin = Twin(INCUMBENT, partial(host.copy, ref))
    serving.observers.append(pairing)
    pairing.observed = serving  # its live generations offer the prompts (pairing.candidate may become a twin)
    pairing.start()
    return pairing


def stop_pairing(host: Any, name: str, pairing: TokenPairing | None) -> None:
    """No more pairs; returns once the pair thread is done with both versions."""
    if pairing is None:
        return
    try:
        pairing.observed.observers.remove(pairing)
    except ValueError:
        pass
    pairing.stop()


def watch(
    host: Any,
    name: str,
    version: str,
    pairing: TokenPairing | None,
    window: float,
    config: ProbationConfig,
    check: Callable[[], None],
) -> Verdict:
    """Watch `version` of `name` for `window` seconds (check() raises to cancel); the verdict with its figures."""
    model = host.models[name]
    base = {k: model.stats.counts[k] for k in COUNTED}
    started = time.monotonic()
    rule = replace(rule_of(config), what="TPOT")
    measure = "TPOT: " + ("cpu" if pairing is None or pairing.cpu else "wall")
    if (
        pairing is not None and pairing.referee_twin is not None
    ):  # openvino-genai: both versions on pair copies with one inference thread, not the served row's
        measure += ", one inference thread (pair copies of both versions)"
    while True:
        check()
        time.sleep(min(0.2, window / 10))
        elapsed = time.monotonic() - started
        f = {k.removesuffix("_total"): model.stats.counts[k] - v for k, v in base.items()}
        f.update(measure=measure, elapsed_s=round(elapsed, 3))
        if host.version(name) != version:
            return Verdict(SUPERSEDED, f"{name} is no longer serving version {version}", f)
        if elapsed < window:
            continue
        if pairing is None:
            why = "no incumbent kept beside it (a first deployment, or serving.probation.paired/referee off)"
            return Verdict(PASSED, f"probation passed: {f['requests']} generations; TPOT not paired: {why}", f)
        verdict = paired_verdict(pairing, rule, f, elapsed, window, config)
        if verdict.state != WATCHING:
            return verdict
