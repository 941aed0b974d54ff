"""Where the target files are and loading them all (cached until a file changes); one by name."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from agent.errors import ConfigError
from agent.targets.parse import parse_target
from agent.targets.schema import Target

ENV_DIR = "EDGE_AGENT_TARGETS_DIR"


def default_directory() -> Path:
    """$EDGE_AGENT_TARGETS_DIR, else the repository's targets/ next to the agent package, else
    <prefix>/share/edge-agent/targets (where a packaged install would put them)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parents[2] / "targets"
    shared = Path(sys.prefix) / "share" / "edge-agent" / "targets"
    return repo if repo.is_dir() or not shared.is_dir() else shared


_CACHE: dict[str, dict[str, Target]] = {}


def load_targets(directory: str | os.PathLike[str] | None = None) -> dict[str, Target]:
    """All targets in `directory` (default: see default_directory()), by name. Raises ConfigError."""
    d = Path(directory) if directory is not None else default_directory()
    if not d.is_dir():
        raise ConfigError(f"targets directory {d} does not exist (set {ENV_DIR} or reinstall)")
    files = sorted(p for p in d.glob("*.yaml") if not p.name.startswith(("_", ".")))
    key = str(d.resolve()) + "|" + "|".join(f"{p.name}:{p.stat().st_mtime_ns}" for p in files)
    if key in _CACHE:
        return dict(_CACHE[key])
    if not files:
        raise ConfigError(f"targets directory {d} has no *.yaml files")
    targets: dict[str, Target] = {}
    for p in files:
        t = parse_target(p)
        targets[t.name] = t
    _CACHE.clear()
    _CACHE[key] = targets
    return dict(targets)


def get_target(name: str, directory: str | os.PathLike[str] | None = None) -> Target:
    targets = load_targets(directory)
    if name not in targets:
        raise ConfigError(f"unknown target {name!r}; valid targets: {', '.join(sorted(targets))}")
    return targets[name]
