"""Local control of a running daemon: the state_dir lock and a request/answer directory (state_dir/control).

A request is `control/<id>.req.json` ({"op": "rollback", "model": NAME}), written atomically by the CLI;
the daemon's loop answers with `control/<id>.done.json` ({"ok": bool, ...}) and deletes the request.
"""

from __future__ import annotations

import fcntl
import json
import os
import secrets
import threading
import time
from pathlib import Path
from typing import Any

from agent.errors import LifecycleError
from agent.lifecycle import stateformat
from agent.util.atomic import atomic_write_json, read_json

OPS = ("rollback", "cancel")
PROBE_GRACE_S = 1.0  # how long acquire() retries before calling the state_dir busy
MAX_AGE_S = 300.0  # an older request (its CLI gave up long ago) is answered as expired, not executed


class StateLock:
    """An exclusive flock on state_dir/agent.lock: one daemon (or offline CLI change) per state_dir."""

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.path = Path(state_dir) / "agent.lock"
        self._fd: int | None = None

    def acquire(self, grace_s: float = PROBE_GRACE_S) -> "StateLock":
        self.path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        end = time.monotonic() + grace_s
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() < end:  # maybe `edge-agent status` probing (a shared lock for microseconds)
                    time.sleep(0.05)
                    continue
                os.close(fd)
                holder = holder_pid(self.path.parent)
                raise LifecycleError(
                    f"state_dir {self.path.parent} is in use by another edge-agent (pid {holder or 'unknown'})"
                ) from None
        try:
            os.ftruncate(fd, 0)
            os.write(fd, f"{os.getpid()}\n".encode())
        except OSError:
            pass  # a full disk: the pid is informational, the flock is what counts
        self._fd = fd
        try:
            stateformat.claim(self.path.parent)  # before anything is written: a state this release cannot read
        except LifecycleError:
            self.release()
            raise
        return self

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)  # closing drops the flock
            self._fd = None

    def __enter__(self) -> "StateLock":
        return self.acquire()

    def __exit__(self, *exc: object) -> None:
        self.release()


def release_after(lock: StateLock | None, left: list[threading.Thread], unlocked: threading.Event, name: str) -> None:
    """Release the state_dir lock once the threads `left` (writers a drain timeout left behind) have ended, on a
    thread of its own when there are any; `unlocked` is set then. A successor never cleans up under a live writer."""

    def release() -> None:
        for t in left:
            t.join()
        if lock is not None:
            lock.release()
        unlocked.set()

    if left:
        threading.Thread(target=release, name=name, daemon=True).start()
    else:
        release()


def holder_pid(state_dir: str | os.PathLike[str]) -> int | None:
    try:
        return int((Path(state_dir) / "agent.lock").read_text().strip() or 0) or None
    except (OSError, ValueError):
        return None


def daemon_running(state_dir: str | os.PathLike[str]) -> bool:
    """True when some process holds the state_dir lock."""
    path = Path(state_dir) / "agent.lock"
    if not path.exists():
        return False
    fd = os.open(path, os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)


def request(state_dir: str | os.PathLike[str], op: str, timeout: float = 60.0, **args: Any) -> dict[str, Any]:
    """Ask the running daemon to do `op`; wait for its answer."""
    if op not in OPS:
        raise LifecycleError(f"unknown control operation {op!r}")
    root = Path(state_dir) / "control"
    req_id = f"{time.time_ns()}-{secrets.token_hex(3)}"
    atomic_write_json(root / f"{req_id}.req.json", {"op": op, "ts": time.time(), **args}, mode=0o600)
    done = root / f"{req_id}.done.json"
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        answer = read_json(done)
        if answer is not None:
            done.unlink(missing_ok=True)
            return dict(answer)
        if not daemon_running(state_dir):
            (root / f"{req_id}.req.json").unlink(missing_ok=True)
            raise LifecycleError("the daemon stopped before answering")
        time.sleep(0.1)
    raise LifecycleError(f"the daemon did not answer within {timeout:.0f}s (request {req_id} stays queued)")


def pending(state_dir: str | os.PathLike[str]) -> list[tuple[str, dict[str, Any] | None]]:
    """Requests waiting for the daemon, oldest first; an unreadable one comes back as None."""
    root = Path(state_dir) / "control"
    if not root.is_dir():
        return []
    out = []
    for p in sorted(root.glob("*.req.json")):
        try:
            out.append((p.name[: -len(".req.json")], json.loads(p.read_bytes())))
        except (OSError, ValueError):
            out.append((p.name[: -len(".req.json")], None))
    return out


def expired(req: dict[str, Any], now: float | None = None) -> bool:
    ts = req.get("ts")
    return not isinstance(ts, (int, float)) or (now or time.time()) - ts > MAX_AGE_S


def answer(state_dir: str | os.PathLike[str], req_id: str, result: dict[str, Any]) -> None:
    root = Path(state_dir) / "control"
    atomic_write_json(root / f"{req_id}.done.json", result, mode=0o600)
    (root / f"{req_id}.req.json").unlink(missing_ok=True)


def offline_rollback(state_dir: str | os.PathLike[str], model: str) -> dict[str, Any]:
    """Rollback while no daemon runs: swap the slots and journal it; the next start serves the result."""
    from agent.lifecycle.journal import Journal
    from agent.lifecycle.slots import ModelSlots
    from agent.lifecycle.states import Event

    with StateLock(state_dir):
        slots, journal = ModelSlots(state_dir), Journal(state_dir)
        prev = slots.get(model)["previous"]
        if not prev:
            raise LifecycleError(f"model {model!r} has no previous version to roll back to")
        dep = journal.create(model, prev.version, {"kind": "rollback", "offline": True}, sha256=prev.sha256)
        journal.apply(dep, Event.ROLLBACK)
        slots.swap(model)
        journal.apply(dep, Event.SWAPPED, reason="rolled back while the daemon was stopped")
        return {"ok": True, "deployment": dep.summary(), "model": model, "version": dep.version}


def offline_cancel(state_dir: str | os.PathLike[str], target: str) -> dict[str, Any]:
    """Cancel while no daemon runs: every in-flight deployment of a model (or the one with this id) takes the
    table's cancel transition and is journaled; the slots were never changed by an uncommitted deployment, so
    the next start serves the committed version and resumes nothing."""
    from agent.lifecycle.journal import Journal
    from agent.lifecycle.states import Event

    with StateLock(state_dir):
        journal = Journal(state_dir)
        hits = [d for d in journal.in_flight() if target in (d.model, d.id)]
        if not hits:
            return {"ok": False, "error": f"nothing in flight for {target!r}"}
        for dep in hits:
            journal.apply(dep, Event.CANCEL, reason="cancelled by operator while the daemon was stopped")
        return {
            "ok": True,
            "model": hits[-1].model,
            "deployment": hits[-1].summary(),
            "cancelled": [d.summary() for d in hits],
        }
