"""Ranking: probe every provider in a target's preference order (its options merged in), then the rest."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from agent.providers import PROVIDER_NAMES, REGISTRY, get
from agent.providers.base import ProbeResult

if TYPE_CHECKING:  # pragma: no cover
    import numpy as np

    from agent.hardware.profile import HardwareProfile


def preferences(target: Any) -> list[tuple[str, dict[str, Any]]]:
    """(provider name, options) pairs from a Target (agent.targets) in preference order; None -> no preference."""
    prefs: list[tuple[str, dict[str, Any]]] = []
    for pref in getattr(target, "providers", None) or []:
        if isinstance(pref, str):
            name, options = pref, dict[str, Any]()
        elif isinstance(pref, dict):
            name, options = pref.get("name", ""), pref.get("options") or {}
        else:
            name, options = pref.name, getattr(pref, "options", None) or {}
        if name not in (n for n, _ in prefs):
            prefs.append((str(name), dict(options)))
    return prefs


def rank(
    profile: "HardwareProfile", target: Any = None, progress: Callable[..., None] | None = None
) -> list[ProbeResult]:
    """Probe results in the target's order (preferred=True), then every other known provider (preferred=False)."""
    prefs = preferences(target)
    tname = getattr(target, "name", None) or "this"
    results = [_probe(name, profile, options, True, tname, progress) for name, options in prefs]
    listed = {name for name, _ in prefs}
    results += [_probe(name, profile, {}, False, tname, progress) for name in PROVIDER_NAMES if name not in listed]
    return results


def _probe(
    name: str,
    profile: "HardwareProfile",
    options: dict[str, Any],
    preferred: bool,
    tname: str,
    progress: Callable[..., None] | None,
) -> ProbeResult:
    if progress:
        progress("probe", provider=name)
    if name not in REGISTRY:
        return ProbeResult(
            name=name,
            available=False,
            reason=f"unknown provider {name!r} in the {tname} target",
            remedy=f"fix the target file; known providers: {', '.join(PROVIDER_NAMES)}",
            options=options,
            preferred=preferred,
        )
    try:
        res = get(name).probe(profile, options)
    except Exception as exc:  # noqa: BLE001 - a provider module that fails to import must not break ranking
        res = ProbeResult(
            name=name,
            available=False,
            reason=f"provider module failed to load: {type(exc).__name__}: {exc}",
            remedy="reinstall edge-agent",
            options=options,
        )
    return dataclasses.replace(res, preferred=preferred)


def smoke_test(
    result: ProbeResult, model_path: str, feeds: dict[str, np.ndarray], expected: dict[str, np.ndarray]
) -> dict[str, Any]:
    """Open a real session on an available provider and run one known input: {ok, precision, device, coverage, error}."""
    import numpy as np

    from agent.errors import EdgeAgentError

    try:
        sess = get(result.name).open_session(model_path, options=dict(result.options))
        got = sess.run(feeds)
        a = sess.assignment()
        bad = [k for k, v in expected.items() if k not in got or not np.allclose(got[k], v, atol=1e-2, rtol=1e-2)]
        out = {
            "ok": not bad,
            "precision": sess.precision,
            "device": sess.device,
            "coverage": a.coverage,
            "compile_ms": round(sess.compile_s * 1e3, 1),
            "error": f"wrong output(s): {', '.join(bad)}" if bad else None,
        }
        sess.close()
        return out
    except EdgeAgentError as exc:
        return {"ok": False, "error": str(exc)}
