"""The one rule for names that travel in topics, paths and manifests: device ids, groups, models, rollouts, versions'
directories. ^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$ as a whole string (no trailing newline), and never '..'."""

from __future__ import annotations

import re

from agent.errors import EdgeAgentError

NAME_PATTERN = r"[A-Za-z0-9][A-Za-z0-9._-]{0,63}"
NAME_RE = re.compile(NAME_PATTERN)
ID_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}")  # deployment ids: a name plus a version and a suffix


def is_valid_name(value: object) -> bool:
    """True for a device id, group, model or rollout name."""
    return isinstance(value, str) and NAME_RE.fullmatch(value) is not None and ".." not in value


def check_name(value: object, what: str = "name", error: type[Exception] = EdgeAgentError) -> str:
    """`value` when it is a valid name, else `error` naming `what` and the rule."""
    if not is_valid_name(value):
        raise error(f"invalid {what} {value!r}: expected {NAME_PATTERN} without '..'")
    return str(value)


def is_valid_id(value: object) -> bool:
    """True for a deployment id (up to 128 characters, same alphabet)."""
    return isinstance(value, str) and ID_RE.fullmatch(value) is not None and ".." not in value
