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


SCRIPT_TOOL = "edge-agent capture-sysroot.sh"
ASSEMBLED = "assembled from public sources"
HAND_BUILT = "hand-built"


def provenance_problems(root: str | Path) -> list[str]:
    """What a capture's info.txt fails to say ([] when it says enough). Three kinds of tree: read on the device by
    capture-sysroot.sh (every file real, `captured` a time), assembled from public sources (each sourced file named
    with `real:`/`transcribed:`, the rest `hand-built:`, even 'none'), and hand-built (`captured: never`)."""
    info = provenance(root)
    problems = [f"info.txt lacks {key!r}" for key in ("captured", "uname", "tool", "anonymised") if key not in info]
    if problems:
        return problems
    sourced = info.get("real", []) + info.get("transcribed", [])
    for entry in sourced:
        rel, arrow, source = entry.partition(" <- ")
        if not (arrow and source):
            problems.append(f"{entry!r} names no source")
        elif not (Path(root) / rel).is_file():
            problems.append(f"{rel} is named in info.txt but absent")
    tool, captured = info["tool"][0], info["captured"][0]
    if tool.startswith(SCRIPT_TOOL):
        if captured in ("never", "") or captured.startswith("unknown"):
            problems.append(f"a capture-sysroot.sh capture says when it was read, not {captured!r}")
    elif tool.startswith(ASSEMBLED):
        if not sourced:
            problems.append("assembled from public sources, yet no `real:` or `transcribed:` file")
        if not info.get("hand-built"):
            problems.append("say which files are hand-built (even 'none')")
    elif tool.startswith(HAND_BUILT):
        if sourced or captured != "never" or not info.get("hand-built"):
            problems.append("a hand-built tree names no source, says `captured: never` and `hand-built:`")
    else:
        problems.append(f"unknown tool {tool!r}")
    return problems
