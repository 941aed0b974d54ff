"""Model versions: dotted integers (`1`, `2.0.3`), compared numerically; trailing zeros do not count."""

from __future__ import annotations

import re

from agent.errors import ManifestError

VERSION_RE = re.compile(r"^[0-9]{1,9}(\.[0-9]{1,9}){0,7}$")


def parse_version(v: object) -> tuple[int, ...]:
    """'2.0.3' -> (2, 0, 3); trailing zeros do not matter for comparison ('1' == '1.0')."""
    if not isinstance(v, str) or not VERSION_RE.fullmatch(v):
        raise ManifestError(f"invalid version {v!r}: use dotted integers like 3 or 2.0.1")
    parts = [int(p) for p in v.split(".")]
    while len(parts) > 1 and parts[-1] == 0:
        parts.pop()
    return tuple(parts)


def compare_versions(a: str, b: str) -> int:
    pa, pb = parse_version(a), parse_version(b)
    n = max(len(pa), len(pb))
    pa, pb = pa + (0,) * (n - len(pa)), pb + (0,) * (n - len(pb))
    return (pa > pb) - (pa < pb)
