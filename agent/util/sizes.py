"""Memory sizes as people write them: bytes, "512M", "2G", "1.5G" (powers of 1024), and "75%" of a total."""

from __future__ import annotations

import re

_UNITS = {"": 0, "K": 10, "M": 20, "G": 30, "T": 40}
_SIZE_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)(?:i?B)?\s*$", re.IGNORECASE)
_PCT_RE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*%\s*$")


def parse_size(value: int | str, total: int | None = None) -> int:
    """Bytes from an int or a size string; "N%" needs `total`. Raises ValueError saying what is accepted."""
    if isinstance(value, bool):
        raise ValueError("expected a size like 512M or 2G, or a number of bytes")
    if isinstance(value, int):
        if value <= 0:
            raise ValueError(f"expected a positive number of bytes, got {value}")
        return value
    if not isinstance(value, str):
        raise ValueError(f"expected a size like 512M or 2G, or a number of bytes, got {value!r}")
    pct = _PCT_RE.match(value)
    if pct:
        if total is None:
            raise ValueError(f"{value!r}: a percentage needs the total memory, which is unknown here")
        share = float(pct.group(1))
        if not 0 < share <= 100:
            raise ValueError(f"{value!r}: expected a percentage in (0, 100]")
        return int(total * share / 100)
    m = _SIZE_RE.match(value)
    if not m:
        raise ValueError(f"expected a size like 512M or 2G, or a number of bytes, got {value!r}")
    n = int(float(m.group(1)) * (1 << _UNITS[m.group(2).upper()]))
    if n <= 0:
        raise ValueError(f"expected a positive size, got {value!r}")
    return n
