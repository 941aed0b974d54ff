"""The providers' probes of one qualification, answered by a row worker.

A probe imports its runtime (OpenVINO's import and plugin load are a good part of a second): asked in the
qualifying process, that import is paid there on top of the row workers' fork server, which has imported the
runtimes already. One forked worker answers every probe instead (a fork), and the qualifying process never
loads a runtime. A probe that cannot be answered there (the worker crashed or timed out) is asked in this
process as before.
"""

from __future__ import annotations

from typing import Any

from agent.isolate.runner import run_isolated

PROBE_TIMEOUT_S = 60.0  # every probe together; each is "a few seconds at most"


def probe_each(profile: Any, options: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Child task: {provider name: ProbeResult} for each name with the options it is probed with."""
    from agent.providers import get

    return {name: get(name).probe(profile, opts) for name, opts in options.items()}


def probe_all(profile: Any, options: dict[str, dict[str, Any]], isolate: bool) -> dict[str, Any]:
    """The probes of `options` (name -> options), answered in a row worker; {} when that failed."""
    if not options:
        return {}
    try:
        res = run_isolated(
            "agent.qualify.probes:probe_each",
            {"profile": profile, "options": options},
            timeout=PROBE_TIMEOUT_S,
            isolate=isolate,
            tag="probes",
        )
    except Exception:  # noqa: BLE001 - e.g. a profile that does not pickle: each probe is asked here instead
        return {}
    return dict(res.value) if res.ok and isinstance(res.value, dict) else {}
