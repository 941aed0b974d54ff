"""Captured device sysroots shipped as package data (one directory per device; README.md names each file's source):
where they are, found through importlib.resources so a plain `pip install` has them too."""

from __future__ import annotations

from importlib import resources
from pathlib import Path

from agent.errors import ConfigError


def root() -> Path:
    """The directory holding the captures. A package installed as a real directory (wheel or editable) is
    required: the captures are read as files by `detect(root)`."""
    base = resources.files(__name__)
    path = Path(str(base))
    if not path.is_dir():
        raise ConfigError(f"captured sysroots are not on the file system ({base}): install edge-agent unzipped")
    return path


def names() -> list[str]:
    """Every captured device, sorted."""
    return sorted(p.name for p in root().iterdir() if p.is_dir() and not p.name.startswith(("_", ".")))


def path(name: str) -> Path:
    """One capture by name; ConfigError naming the known ones otherwise."""
    p = root() / name
    if name not in names():
        raise ConfigError(f"no captured sysroot {name!r}; known: {', '.join(names())}")
    return p


INFO = ".captures/info.txt"


def provenance(root: str | Path) -> dict[str, list[str]]:
    """A capture's .captures/info.txt as key -> values (keys repeat: one `real:` line per file); {} without one.
    Keys: captured, uname, tool, anonymised (capture-sysroot.sh writes these), real, transcribed, hand-built."""
    try:
        text = (Path(root) / INFO).read_text(encoding="utf-8", errors="replace")
    except OSError:
        return {}
    out: dict[str, list[str]] = {}
    for line in text.splitlines():
        key, sep, value = line.partition(":")
        if sep and key.strip():
            out.setdefault(key.strip(), []).append(value.strip())
    return out
