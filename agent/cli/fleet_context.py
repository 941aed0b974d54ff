"""Fleet contexts: the broker, prefix, store and key every fleet command repeats, kept in one file.

~/.config/edge-agent/fleet.yaml (or $EDGE_AGENT_FLEET_CONTEXTS):

    current: lab
    contexts:
      lab: {broker: mqtt://broker.lab:1883, prefix: edge, store: /srv/edge-cp, key: /srv/edge-cp/fleet.key}

`edge-agent fleet --context NAME ...` (or `current`) fills those options; a flag given on the command line wins.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent.errors import ConfigError

KEYS = {
    "broker": "broker",
    "prefix": "prefix",
    "store": "store",
    "key": "key_file",
    "username": "username",
    "password_file": "password_file",
    "ca": "ca_file",
    "cert": "cert_file",
    "cert_key": "cert_key_file",
}
MAX_BYTES = 64 * 1024


def contexts_path() -> Path:
    env = os.environ.get("EDGE_AGENT_FLEET_CONTEXTS")
    if env:
        return Path(env)
    base = os.environ.get("XDG_CONFIG_HOME") or str(Path.home() / ".config")
    return Path(base) / "edge-agent" / "fleet.yaml"


def load_context(name: str | None) -> tuple[str | None, dict[str, Any]]:
    """(context name, {param name: value}) from the contexts file: `name`, else its `current`, else nothing."""
    path = contexts_path()
    if not path.is_file():
        if name:
            raise ConfigError(
                f"--context {name}: no contexts file at {path} (docs/scaling.md, 'Fleet contexts', shows its form)"
            )
        return None, {}
    from agent.util.yamlsafe import load_file

    doc = load_file(path, "fleet contexts", ConfigError, max_bytes=MAX_BYTES)
    if not isinstance(doc, dict) or not isinstance(doc.get("contexts", {}), dict):
        raise ConfigError(f"{path}: expected `contexts: {{NAME: {{broker: ..., store: ...}}}}`")
    name = name or doc.get("current")
    if not name:
        return None, {}
    ctx = (doc.get("contexts") or {}).get(name)
    if not isinstance(ctx, dict):
        known = ", ".join(sorted(doc.get("contexts") or {})) or "none"
        raise ConfigError(f"{path}: no context {name!r} (contexts: {known})")
    unknown = set(ctx) - set(KEYS)
    if unknown:
        raise ConfigError(f"{path}: contexts.{name}.{sorted(unknown)[0]}: unknown key (known: {', '.join(KEYS)})")
    return str(name), {KEYS[k]: str(v) for k, v in ctx.items()}


def default_map(values: dict[str, Any], commands) -> dict[str, dict[str, Any]]:
    """click's default_map for every fleet command: each gets the context's values for the params it has."""
    return {name: dict(values) for name in commands}
