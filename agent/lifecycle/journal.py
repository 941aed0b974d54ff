"""The deployment journal: one JSON file per deployment, replaced atomically before each action."""

from __future__ import annotations

import copy
import json
import os
import secrets
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent import names
from agent.errors import LifecycleError
from agent.lifecycle.states import TERMINAL, State
from agent.lifecycle.table import next_state
from agent.util.atomic import atomic_write_json

TEMP_MAX_AGE_S = 600.0  # clean_temp() removes only temp files this old: never a write in progress elsewhere


def check_name(value: object, what: str) -> str:
    """Model names and versions are path components here: agent.names' rule, as a LifecycleError."""
    return names.check_name(value, what, LifecycleError)


@dataclass
class Deployment:
    """One deployment's journaled record. `data` holds action results (sha256, decision, ...)."""

    id: str
    model: str
    version: str
    state: State
    source: dict[str, Any]
    created: float
    updated: float
    reason: str | None = None
    attempts: dict[str, int] = field(default_factory=dict)
    history: list[dict[str, Any]] = field(default_factory=list)
    data: dict[str, Any] = field(default_factory=dict)
    seq: int = 0  # creation order in this journal (monotonic; 0: a record written before the field existed)
    write_seq: int = 0  # order of the last write in this journal (monotonic, like seq)

    @property
    def order(self) -> tuple[int, float, str]:
        """Creation order: the journal's sequence, never the wall clock (old records, seq 0, come first and
        keep their creation time between them)."""
        return (self.seq, self.created if not self.seq else 0.0, self.id)

    @property
    def write_order(self) -> tuple[int, float, str]:
        """Order of the last write, by the journal's sequence (wall clock only between old records)."""
        return (self.write_seq, self.updated if not self.write_seq else 0.0, self.id)

    @property
    def terminal(self) -> bool:
        return self.state in TERMINAL

    @property
    def result(self) -> str | None:
        return self.state.value if self.terminal else None

    def to_dict(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "model": self.model,
            "version": self.version,
            "state": self.state.value,
            "result": self.result,
            "reason": self.reason,
            "source": self.source,
            "created": self.created,
            "updated": self.updated,
            "attempts": dict(self.attempts),
            "history": list(self.history),
            "data": dict(self.data),
            "seq": self.seq,
            "write_seq": self.write_seq,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "Deployment":
        try:
            return cls(
                id=d["id"],
                model=d["model"],
                version=str(d["version"]),
                state=State(d["state"]),
                source=dict(d.get("source") or {}),
                created=float(d["created"]),
                updated=float(d["updated"]),
                reason=d.get("reason"),
                attempts=dict(d.get("attempts") or {}),
                history=list(d.get("history") or []),
                data=dict(d.get("data") or {}),
                seq=int(d.get("seq") or 0),
                write_seq=int(d.get("write_seq") or 0),
            )
        except (KeyError, ValueError, TypeError) as exc:
            raise LifecycleError(f"malformed journal record: {exc}") from None

    def summary(self) -> dict[str, Any]:
        """The pinned per-deployment fields of the status document."""
        out = {
            "id": self.id,
            "version": self.version,
            "state": self.state.value,
            "result": self.result,
            "reason": self.reason,
            "ts": self.updated,
        }
        if isinstance(self.data.get("swap"), dict):
            out["swap"] = self.data["swap"].get("mode")  # make-before-break | stop-then-start, as activated
            if self.data["swap"].get("first_answer_s") is not None:  # session creation + first warm-up answer
                out["first_answer_s"] = self.data["swap"]["first_answer_s"]
        for key in ("bytes_fetched", "bytes_reused"):  # what the pull moved and reused (agent.artifacts.delta)
            if isinstance(self.data.get(key), int):
                out[key] = self.data[key]
        for key in ("shadow", "probation"):  # the figures behind the verdicts (docs/serving.md)
            if isinstance(self.data.get(key), dict):
                out[key] = self.data[key]
        return out


class Journal:
    """state_dir/deployments/<id>.json; every write is temp + fsync + rename + directory fsync.

    One instance per state_dir is shared by the orchestrator and the steps. close() (daemon stop) waits for a
    write in progress and refuses later ones, so a thread that outlives stop() cannot write behind the back of
    whoever takes the state_dir next."""

    def __init__(self, state_dir: str | os.PathLike[str]):
        self.root = Path(state_dir) / "deployments"
        self.root.mkdir(parents=True, exist_ok=True)
        self._write_lock = threading.Lock()
        self._closed = False
        self._seq = max((max(d.seq, d.write_seq) for d in self.all()), default=0)

    def path(self, dep_id: str) -> Path:
        return self.root / f"{dep_id}.json"

    def close(self) -> None:
        with self._write_lock:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def create(self, model: str, version: str, source: dict[str, Any], **data: Any) -> Deployment:
        check_name(model, "model name")
        check_name(str(version), "version")
        now = time.time()
        stamp = time.strftime("%Y%m%dT%H%M%S", time.gmtime(now))
        dep_id = f"{stamp}-{model}-{version}-{secrets.token_hex(3)}"
        dep = Deployment(dep_id, model, str(version), State.RECEIVED, source, now, now, data=dict(data))
        dep.history.append({"state": State.RECEIVED.value, "event": None, "ts": now})
        self.save(dep, new=True)
        return dep

    def save(self, dep: Deployment, new: bool = False) -> None:
        with self._write_lock:
            if self._closed:
                raise LifecycleError(f"journal of {self.root.parent} is closed (daemon stopped): {dep.id} not written")
            self._seq += 1
            dep.updated, dep.write_seq = time.time(), self._seq
            if new:
                dep.seq = self._seq
            atomic_write_json(self.path(dep.id), dep.to_dict(), mode=0o600)

    def apply(self, dep: Deployment, event: str, reason: str | None = None, **data: Any) -> State:
        """Move `dep` along the table and persist it before the caller acts on the new state. When the write
        fails, `dep` is left exactly as it was (memory and disk agree)."""
        new = next_state(dep.state, event)
        nxt = copy.copy(dep)
        nxt.attempts, nxt.history, nxt.data = dict(dep.attempts), list(dep.history), dict(dep.data)
        nxt.state = new
        if reason is not None or new in TERMINAL:
            nxt.reason = reason
        nxt.attempts[new.value] = nxt.attempts.get(new.value, 0) + 1
        nxt.data.update(data)
        nxt.history.append({"state": new.value, "event": str(event), "ts": time.time(), "reason": reason})
        self.save(nxt)
        dep.__dict__.update(nxt.__dict__)
        return new

    def load(self, dep_id: str) -> Deployment:
        try:
            return Deployment.from_dict(json.loads(self.path(dep_id).read_bytes()))
        except FileNotFoundError:
            raise LifecycleError(f"no deployment {dep_id!r}") from None
        except ValueError as exc:
            raise LifecycleError(f"journal {dep_id}: {exc}") from None

    def all(self) -> list[Deployment]:
        """Every readable record, oldest first by the journal's sequence (temp files of writes in progress are skipped)."""
        deps = []
        for p in self.root.iterdir():
            if p.suffix != ".json" or not names.is_valid_id(p.stem):
                continue
            try:
                deps.append(Deployment.from_dict(json.loads(p.read_bytes())))
            except (ValueError, LifecycleError):
                continue  # unreadable: reported by check()
        return sorted(deps, key=lambda d: d.order)

    def clean_temp(self, older_than_s: float = TEMP_MAX_AGE_S) -> int:
        """Remove temp files of writes a crash interrupted before the rename. Only those older than
        `older_than_s`: a fresh one may be a write in progress (another agent still stopping in this process,
        an operator's tool); leftovers are harmless meanwhile (all() skips them)."""
        cutoff = time.time() - older_than_s
        removed = 0
        for p in self.root.iterdir():
            if not (p.name.startswith(".") and p.name.endswith(".tmp")):
                continue
            try:
                if p.stat().st_mtime <= cutoff:
                    p.unlink()
                    removed += 1
            except FileNotFoundError:
                continue
        return removed

    def in_flight(self) -> list[Deployment]:
        return [d for d in self.all() if not d.terminal]

    def recent(self, limit: int = 20) -> list[Deployment]:
        return sorted(self.all(), key=lambda d: d.write_order, reverse=True)[:limit]

    def latest_per_model(self) -> dict[str, Deployment]:
        out: dict[str, Deployment] = {}
        for d in self.all():
            if d.model not in out or d.order >= out[d.model].order:
                out[d.model] = d
        return out

    def prune(self, keep_per_model: int = 20, keep_ids: set[str] | None = None) -> int:
        """Delete the oldest terminal records beyond `keep_per_model` per model (never those in `keep_ids`: the
        records the slots point at, from which a damaged slots.json is rebuilt)."""
        by_model: dict[str, list[Deployment]] = {}
        for d in self.all():
            if d.terminal:
                by_model.setdefault(d.model, []).append(d)
        removed = 0
        for deps in by_model.values():
            for d in deps[:-keep_per_model] if len(deps) > keep_per_model else []:
                if keep_ids and d.id in keep_ids:
                    continue
                self.path(d.id).unlink(missing_ok=True)
                removed += 1
        return removed


def check_history(dep: Deployment) -> list[str]:
    """Problems in a record's history: every step must be a legal edge of the table."""
    problems = []
    hist = dep.history
    if not hist or hist[0].get("state") != State.RECEIVED.value:
        problems.append(f"{dep.id}: history does not start at received")
    for prev, cur in zip(hist, hist[1:]):
        try:
            if next_state(prev["state"], cur["event"]).value != cur["state"]:
                problems.append(f"{dep.id}: {prev['state']} --{cur['event']}--> {cur['state']} is not in the table")
        except (LifecycleError, KeyError) as exc:
            problems.append(f"{dep.id}: {exc}")
    if hist and hist[-1].get("state") != dep.state.value:
        problems.append(f"{dep.id}: state {dep.state.value} differs from its last history entry")
    return problems
