"""Cold start in the verdict: session creation time per row, cold (no compiled cache) and warm (cache hit),
and the target's cold-start budget (`qualify: {cold_start_budget_s: N}`).

With a provider that writes a compiled cache (OpenVINO CACHE_DIR, TensorRT engines, EPContext), cold is the row's
first session when the row's cache was empty before it (it compiled into it: the first qualification of a model),
else a session built against an empty temporary cache directory; warm is one built against the row's sealed cache.
A provider that writes nothing there (ORT CPU) has `cache: "none"`: cold is the row's first session of the
model in its worker, warm the next one (file pages and the runtime's own state warm).
"""

from __future__ import annotations

import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any


def _timed(
    open_session: Callable[[str | None], Any], cache_dir: str | None, keep: Callable[[Any], None] | None = None
) -> float:
    t0 = time.perf_counter()
    sess = open_session(cache_dir)
    took = time.perf_counter() - t0
    if keep is None:
        sess.close()
    else:
        keep(sess)  # the caller owns it now (a kept row worker re-times it in a confirmation round)
    return round(took, 4)


def cache_empty(cache_dir: str | None) -> bool:
    """No compiled artefact in the row's cache directory (or no directory)."""
    from agent.package import cacheseal

    return not cache_dir or not any(p.is_file() and p.name != cacheseal.SEAL for p in Path(str(cache_dir)).rglob("*"))


def session_times(
    open_session: Callable[[str | None], Any],
    cache_dir: str | None,
    first_s: float,
    first_was_cold: bool = False,
    keep: Callable[[Any], None] | None = None,
) -> dict[str, Any]:
    """{"cold_s", "warm_s", "cache", "how"}; `first_s`: the row's first session creation (its compile_s);
    `first_was_cold`: the row's cache was empty before that session. `keep`: given the warm session (the last
    one opened, on the row's own cache) instead of closing it."""
    from agent.package import cacheseal

    if cache_empty(cache_dir):
        warm = _timed(open_session, cache_dir, keep)
        return {
            "cold_s": round(first_s, 4),
            "warm_s": warm,
            "cache": "none",
            "how": "no compiled cache on this provider: cold = first session in the worker, warm = the next",
        }
    if first_was_cold:  # it compiled into the empty cache: building another one would only measure it twice
        note = cacheseal.verify_or_reset(cache_dir)
        out = {
            "cold_s": round(first_s, 4),
            "warm_s": _timed(open_session, cache_dir, keep),
            "cache": "compiled",
            "how": "cold = the row's first session, compiled into its empty cache; warm = that cache, sealed (hit)",
        }
        return {**out, "cache_rebuilt": note} if note else out
    tmp = tempfile.mkdtemp(prefix="cold-cache-")
    try:
        cold = _timed(open_session, tmp)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    note = cacheseal.verify_or_reset(cache_dir)
    warm = _timed(open_session, cache_dir, keep)
    out = {
        "cold_s": cold,
        "warm_s": warm,
        "cache": "compiled",
        "how": "cold = empty compiled cache, warm = the row's sealed cache (hit)",
    }
    if note:
        out["cache_rebuilt"] = note
    return out


def over_budget(session_s: dict[str, Any] | None, budget_s: float | None) -> str:
    """The failure reason when the cold session creation exceeds the target's budget, else ''."""
    cold = (session_s or {}).get("cold_s")
    if budget_s is None or cold is None or cold <= budget_s:
        return ""
    return f"cold start: session creation {cold:.3g} s without a compiled cache > the target's cold_start_budget_s {budget_s:g} s"
