"""The device's sequence for the documents it signs for a control plane (decision records, conformance reports):
`seq` in each, so the service can refuse a replayed older copy (agent.controlplane.freshness).

state_dir/doc-seq.json {"seq": N} holds the last number handed out. `take()` reserves the next one before the
document is signed: the new value is written atomically and fsynced (agent.util.atomic) under an flock on
state_dir/doc-seq.lock, so the daemon's sync and `edge-agent control-plane report` never hand out the same number
and a restart never goes back. A number reserved and never posted is a harmless gap. An unreadable file is an
error (never silently 0: the service would refuse every document signed from there).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

from agent.errors import ConfigError
from agent.util.atomic import atomic_write_json, read_json

FILE = "doc-seq.json"
LOCK = "doc-seq.lock"
MAX_FLOOR = 2**53  # a service's "highest seen" above this is not believed (the counter would run out)


@contextlib.contextmanager
def _locked(state_dir: Path) -> Iterator[None]:
    state_dir.mkdir(parents=True, exist_ok=True)
    fd = os.open(state_dir / LOCK, os.O_RDWR | os.O_CREAT, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing drops the flock


def current(state_dir: str | os.PathLike[str]) -> int:
    """The last number handed out (0: none yet)."""
    path = Path(state_dir) / FILE
    try:
        doc = read_json(path, default={"seq": 0})
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable document sequence ({exc}); fix or restore it") from None
    seq = doc.get("seq") if isinstance(doc, dict) else None
    if type(seq) is not int or seq < 0:
        raise ConfigError(f"{path}: seq: expected a non-negative integer, got {str(seq)[:40]!r}")
    return seq


def take(state_dir: str | os.PathLike[str]) -> int:
    """Reserve the next number (durable before it is returned)."""
    return advance(state_dir, 0)


def advance(state_dir: str | os.PathLike[str], floor: int) -> int:
    """Reserve the next number above both the last one and `floor` (the highest the service says it has seen,
    after a state_dir restored from an older backup)."""
    state_dir = Path(state_dir)
    with _locked(state_dir):
        seq = max(current(state_dir), floor) + 1
        atomic_write_json(state_dir / FILE, {"seq": seq}, mode=0o600)
    return seq
