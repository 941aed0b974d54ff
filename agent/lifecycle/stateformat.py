"""The state directory's format stamp (state_dir/state_format.json), so that releases N-1 and N+1 can share one
state directory while a new agent release is on trial (docs/self-update.md).

{"format": F, "min_reader": M, "written_by": "<agent version>"}: F is the newest format written there; M the oldest
reader format that still reads it. A release reads every state with M <= READS_UP_TO and refuses any other at
start-up (naming both), before it writes anything. A change every older reader tolerates (a new optional key: the
readers keep unknown keys, SlotEntry.extra) raises F and keeps M; only a change older readers cannot read raises M,
and a release must not raise M while it is on trial (it would leave the release it rolls back to unable to start).
A directory without the stamp (written before it existed) is format 0, read by every release."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent import __version__
from agent.errors import LifecycleError
from agent.util.atomic import atomic_write_json, read_json

NAME = "state_format.json"
STATE_FORMAT = 1  # what this release writes
MIN_READER = 0  # the oldest reader format that reads what this release writes (0: every release so far)
READS_UP_TO = 1  # the newest min_reader this release reads


def read(state_dir: str | os.PathLike[str]) -> dict[str, Any]:
    try:
        doc = read_json(Path(state_dir) / NAME, default=None)
    except (OSError, ValueError):
        doc = None
    if not isinstance(doc, dict):
        return {"format": 0, "min_reader": 0, "written_by": None}
    return doc


def claim(state_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Refuse a state this release cannot read (LifecycleError), else stamp this release's format when it is newer
    than the one found (never lowering it); returns the stamp now in force."""
    found = read(state_dir)
    fmt, min_reader = _int(found.get("format")), _int(found.get("min_reader"))
    if min_reader > READS_UP_TO:
        raise LifecycleError(
            f"{Path(state_dir) / NAME}: state format {fmt} written by edge-agent {found.get('written_by')} needs a "
            f"reader of format {min_reader}; this release ({__version__}) reads up to {READS_UP_TO}"
        )
    if fmt >= STATE_FORMAT:
        return found
    doc = {"format": STATE_FORMAT, "min_reader": max(MIN_READER, min_reader), "written_by": __version__}
    atomic_write_json(Path(state_dir) / NAME, doc, mode=0o600)
    return doc


def _int(value: Any) -> int:
    return value if isinstance(value, int) and value >= 0 else 0
