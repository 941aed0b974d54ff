"""The typed getters of agent.yaml's validation: every error names the key path; relative paths resolve
against the config file's directory. No I/O."""

from __future__ import annotations

import difflib
import os
from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.names import is_valid_name


def real(raw: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw != raw or not lo <= raw <= hi:
        raise ConfigError(f"{key}: expected a number {lo:g}-{hi:g}, got {show(raw)}")
    return float(raw)


def flag(raw: Any, key: str) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(f"{key}: expected true or false, got {show(raw)}")
    return raw


def quantiles(raw: Any, key: str) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)) or not raw or any(type(q) is not int or q not in (50, 90, 99) for q in raw):
        raise ConfigError(f"{key}: expected a non-empty list of 50, 90 and 99, got {show(raw)}")
    return tuple(sorted(set(raw)))


def show(value: Any) -> str:
    """How a wrong value is shown in an error: its kind for containers, else its repr."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "nothing (null)" if value is None else repr(value)


class Validator:
    """Typed getters that raise ConfigError naming the key path; relative paths resolve against base_dir."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir

    def mapping(self, raw: Any, where: str, allowed: tuple[str, ...]) -> dict[str, Any]:
        if not isinstance(raw, dict):
            label = where or "config"
            raise ConfigError(f"{label}: expected a mapping, got {show(raw)}")
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                full = f"{where}.{key}" if where else str(key)
                raise ConfigError(f"{full}: unknown key{hint}; allowed here: {', '.join(allowed)}")
        return raw

    def string(self, raw: Any, key: str) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError(f"{key}: expected a non-empty string, got {show(raw)}")
        return raw.strip()

    def name(self, raw: Any, key: str) -> str:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        s = self.string(raw, key)
        if not is_valid_name(s):
            raise ConfigError(
                f"{key}: expected 1-64 characters of [A-Za-z0-9._-] starting with a letter or digit, got {s!r}"
            )
        return s

    def integer(self, raw: Any, key: str, lo: int, hi: int) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"{key}: expected an integer {lo}-{hi}, got {show(raw)}")
        if not lo <= raw <= hi:
            raise ConfigError(f"{key}: expected an integer {lo}-{hi}, got {raw}")
        return raw

    def number(self, raw: Any, key: str, lo: float, hi: float) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ConfigError(f"{key}: expected a number of seconds {lo:g}-{hi:g}, got {show(raw)}")
        if not lo <= raw <= hi or raw != raw:
            raise ConfigError(f"{key}: expected a number of seconds {lo:g}-{hi:g}, got {raw}")
        return float(raw)

    def path(self, raw: Any, key: str) -> Path:
        s = self.string(raw, key)
        if "\0" in s:
            raise ConfigError(f"{key}: path contains a NUL byte")
        p = Path(os.path.expanduser(s)) if s.startswith("~") else Path(s)
        return p if p.is_absolute() else (self.base_dir / p)
