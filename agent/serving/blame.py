"""Who is to blame for a failing or NaN/Inf answer: the request (bad text, NaN/Inf input, the referee fails
too) or the version being served. Probation counts only what the version caused."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

# (succeeded, referee version, outputs) of the same request on the referee; None without one
RefereeRun = Callable[[], "tuple[bool, str, dict[str, Any]] | None"]


@dataclass(frozen=True)
class Fault:
    """A failed (or NaN/Inf) run that is the request's doing: never counted against the version. invalid_input:
    the input itself is malformed (the client's error: InvalidInput); else the version is not blamed for it."""

    why: str
    invalid_input: bool = False


_DOT_KINDS = (np.dtype(np.float32), np.dtype(np.float64))
_DOT_MAX = 10_000  # OpenBLAS runs dot single-threaded up to here: no pool wake-ups on the serving path


def nonfinite(outputs: dict[str, Any]) -> bool:
    """Any NaN/Inf in a float output? Small f32/f64 outputs first try one BLAS dot product (v.v is finite
    when every element is; measured 3x cheaper than isfinite().all() right after a run, when caches are
    cold); a non-finite dot (NaN/Inf, or overflow of large finite values) is settled by the exact check."""
    for v in outputs.values():
        if type(v) is not np.ndarray or v.dtype.kind != "f" or not v.size:
            continue
        if v.dtype in _DOT_KINDS and v.size <= _DOT_MAX and math.isfinite(np.vdot(v, v)):
            continue
        if not np.isfinite(v).all():
            return True
    return False


def invalid_text(feeds: dict[str, Any]) -> str | None:
    """The first string element that is not valid UTF-8 text (a lone surrogate, undecodable bytes), if any."""
    for name, v in feeds.items():
        if type(v) is not np.ndarray or v.dtype.kind != "O":
            continue
        for i, item in enumerate(v.flat):
            try:
                if isinstance(item, str):
                    item.encode("utf-8")
                elif isinstance(item, bytes):
                    item.decode("utf-8")
            except UnicodeError:
                return f"input {name!r} element {i} is not valid UTF-8 text"
    return None


def request_fault(feeds: dict[str, Any], referee_run: RefereeRun) -> Fault | None:
    """Why the runtime's failure on `feeds` is the request's doing, or None (the version is to blame)."""
    text = invalid_text(feeds)
    if text:
        return Fault(text, invalid_input=True)
    if nonfinite(feeds):
        return Fault("its input holds NaN/Inf")
    ran = referee_run()
    if ran is not None and not ran[0]:
        return Fault(f"version {ran[1]} fails on the same input")
    return None


def request_made_nonfinite(feeds: dict[str, Any], referee_run: RefereeRun) -> bool:
    """A NaN/Inf output is the request's doing when its input holds NaN/Inf, unless the referee (the
    incumbent) answers the same input with finite values."""
    if not nonfinite(feeds):
        return False
    ran = referee_run()
    return ran is None or not ran[0] or nonfinite(ran[2])
