"""ControlPlaneSync: the daemon's side of the control plane (agent.yaml `control_plane`; docs/control-plane.md).

At start it enrolls the device when it is not enrolled yet (the request signed with the device key, the same
document as `edge-agent control-plane enroll`), then posts every new or changed decision record in
state_dir/decisions (with the deployment's signed attestations) signed with the device key, as `edge-agent
control-plane report` does; the service keeps one record per deployment. It runs on its own thread and reaches
the control plane only through an injected port: a control plane that is slow, down or refusing never blocks
serving or the lifecycle. The queue is the decisions directory itself (bounded by the journal's pruning);
state_dir/control-plane.json acknowledges what was posted, so a restart posts what was not; failures are
retried with back-off (1 s doubling to `retry_max_s`). Each post carries the next number of the device's
document sequence (agent.transport.docseq, durable), so the service refuses replays of older copies; a 409
naming a higher sequence than this state_dir's (restored from an older backup) moves the counter above it. `snapshot()` is the status document's `control_plane`.
"""

from __future__ import annotations

import hashlib
import re
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.errors import ConfigError, EdgeAgentError
from agent.services import Emit
from agent.util.atomic import atomic_write_json, read_json

STATE_FILE = "control-plane.json"
SETTLE_S = 0.5  # a record (or its attestation) written less than this ago is left for the next round
PER_ROUND = 16  # records posted per round at most (the rest wait for the next one)
STALE = re.compile(r"highest seen (\d+)")  # the service's 409 for a seq at or below its mark (controlplane.freshness)


class ControlPlanePort(Protocol):
    """Where signed documents go (agent.transport.cpclient over HTTP in the daemon)."""

    url: str

    def enroll(self, doc: dict[str, Any]) -> dict[str, Any]: ...

    def post_decision(self, device_id: str, doc: dict[str, Any]) -> Any: ...


class HttpControlPlane:
    """The port over HTTP: the control plane's API through agent.transport.cpclient (stdlib urllib)."""

    def __init__(self, url: str, timeout: float = 5.0):
        self.url, self.timeout = url, timeout

    def enroll(self, doc: dict[str, Any]) -> dict[str, Any]:
        from agent.transport.cpclient import call

        answer: dict[str, Any] = call(self.url, "POST", "/api/v1/enroll", doc, timeout=self.timeout)
        return answer

    def post_decision(self, device_id: str, doc: dict[str, Any]) -> Any:
        from agent.transport.cpclient import call

        return call(self.url, "POST", f"/api/v1/devices/{device_id}/decisions", doc, timeout=self.timeout)


class NotAccepted(ConfigError):
    """The control plane keeps this device pending (or rejected it): nothing is posted until accepted."""


class ControlPlaneSync:
    def __init__(
        self,
        port: ControlPlanePort,
        state_dir: str | Path,
        device_id: str,
        key: Any,
        *,
        token: str | None = None,
        report: bool = True,
        retry_max_s: float = 60.0,
        identity: Callable[[], dict[str, Any]] = dict,
        on_change: Callable[[], Any] | None = None,
        emit: Emit | None = None,
        interval_s: float = 1.0,
    ):
        """`identity`: the enrollment request's `target` and `hardware` (asked when enrolling); `on_change`: the
        status document is rewritten (called off every lock here)."""
        from agent.artifacts.keys import key_id

        self.port, self.state_dir, self.device_id, self.key = port, Path(state_dir), device_id, key
        self.token, self.report, self.retry_max_s = token, report, retry_max_s
        self.identity, self.on_change, self.emit = identity, on_change, emit or (lambda record: None)
        self.interval_s = interval_s
        self.key_id = key_id(key.public_key())
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._failures = 0
        self._digests: dict[str, tuple[tuple[tuple[str, int, int], ...], str]] = {}  # stem -> (parts' stats, digest)
        saved = read_json(self.path, default=None)
        same = isinstance(saved, dict) and saved.get("url") == port.url and saved.get("key_id") == self.key_id
        self.state: dict[str, Any] = saved if same else {"url": port.url, "key_id": self.key_id}
        self.state.setdefault("acked", {})
        self.last_error: str | None = None
        self.last_error_ts: float | None = None
        self.pending = 0

    @property
    def path(self) -> Path:
        return self.state_dir / STATE_FILE

    # ---- life ----------------------------------------------------------------------------------
    def start(self) -> ControlPlaneSync:
        self._thread = threading.Thread(target=self._run, name=f"cpsync-{self.device_id}", daemon=True)
        self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        self._stop.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout)

    def _run(self) -> None:
        while not self._stop.is_set():
            changed = self.round_safely()
            if changed and self.on_change is not None and not self._stop.is_set():
                try:
                    self.on_change()
                except Exception:  # noqa: BLE001 - a status write failing must not end the sync
                    pass
            delay = self.interval_s if not self._failures else min(self.retry_max_s, 2.0 ** (self._failures - 1))
            self._stop.wait(delay)

    def round_safely(self) -> bool:
        """One round; a failure is counted for the back-off and kept as last_error. True when the status changed."""
        before = self._brief()
        try:
            self.round()
        except EdgeAgentError as exc:
            self._failed(str(exc))
        except Exception as exc:  # noqa: BLE001 - the sync must survive anything one round meets
            self._failed(f"{type(exc).__name__}: {exc}")
        else:
            self._failures = 0
        return self._brief() != before

    def _brief(self) -> dict[str, Any]:
        """The snapshot less the time of the last error: a failure repeated does not rewrite the status."""
        doc = self.snapshot()
        doc.pop("last_error_ts")
        return doc

    def _failed(self, why: str) -> None:
        first = why != self.last_error
        self._failures += 1
        with self._lock:
            self.last_error, self.last_error_ts = why, time.time()
        if first:
            self.emit({"event": "control_plane", "ok": False, "reason": why})

    # ---- one round: enroll when needed, then post what is not acknowledged ---------------------------
    def round(self) -> None:
        todo = self._unacked() if self.report else []
        with self._lock:
            self.pending = len(todo)
        if self.state.get("enrollment") != "accepted":
            self._enroll()
        for dep_id, digest in todo[:PER_ROUND]:
            if self._stop.is_set():
                return
            self._post(dep_id, digest)
        if todo:
            left = self._unacked()
            with self._lock:
                self.pending = len(left)

    def _enroll(self) -> None:
        from agent.transport.cpclient import enroll_request

        who = self.identity()
        doc = enroll_request(
            self.device_id, self.key, hardware=who.get("hardware"), target=who.get("target"), token=self.token
        )
        state = str(self.port.enroll(doc).get("state"))
        with self._lock:
            self.state.update(enrollment=state, enrolled_ts=time.time())
            self._save()
        self.emit({"event": "control_plane", "ok": True, "enrollment": state, "url": self.port.url})
        if state != "accepted":
            raise NotAccepted(f"enrollment: {self.device_id} is {state} at {self.port.url} (an operator accepts it)")

    def _post(self, dep_id: str, digest: str) -> None:
        from agent.transport import docseq
        from agent.transport.cpclient import HttpError, signed_decision

        decisions = self.state_dir / "decisions"
        if not (decisions / f"{dep_id}.json").exists():
            return  # pruned since the scan (the journal keeps so many deployments)
        seq = docseq.take(self.state_dir)  # durable before it is signed: a restart never signs it again
        doc = signed_decision(
            self.device_id, self.key, decisions / f"{dep_id}.json", self.state_dir / "attestations", seq=seq
        )
        try:
            self.port.post_decision(self.device_id, doc)
        except HttpError as exc:
            seen = STALE.search(str(exc)) if exc.code == 409 else None
            if seen and seq <= int(seen.group(1)) < docseq.MAX_FLOOR:  # state_dir restored from an older backup:
                docseq.advance(self.state_dir, int(seen.group(1)))  # continue above; re-signed next round
            if exc.code in (403, 404):  # not (or no longer) accepted, or unknown there: ask again next round
                with self._lock:
                    self.state["enrollment"] = None
                raise
            if exc.code in (400, 413, 422):  # this record will never be taken: say so, do not loop on it
                self._ack(dep_id, digest, refused=str(exc))
                raise
            raise
        self._ack(dep_id, digest)

    def _ack(self, dep_id: str, digest: str, refused: str | None = None) -> None:
        with self._lock:
            entry: dict[str, Any] = {"sha256": digest, "ts": time.time()}
            if refused:
                entry["refused"] = refused
            self.state["acked"][dep_id] = entry
            if not refused:
                self.state["last_posted"] = {"deployment_id": dep_id, "ts": entry["ts"]}
            self._save()

    def _unacked(self) -> list[tuple[str, str]]:
        """(deployment id, digest) of the records whose content (or attestations) differ from what was acked,
        oldest first; acks of records pruned from the directory are dropped."""
        files = []
        for f in (self.state_dir / "decisions").glob("*.json"):
            try:
                files.append((f.stat().st_mtime, f))
            except OSError:
                continue
        acked, out, now = self.state["acked"], [], time.time()
        for _, f in sorted(files):
            parts = [f, *sorted((self.state_dir / "attestations").glob(f"{f.stem}.*.intoto.json"))]
            try:
                stats = tuple((p.name, st.st_mtime_ns, st.st_size) for p in parts for st in (p.stat(),))
                newest = max(mtime for _, mtime, _ in stats) / 1e9
                known = self._digests.get(f.stem)
                if known is None or known[0] != stats:  # read and hashed only when a part changed on disk
                    known = (
                        stats,
                        hashlib.sha256(b"".join(p.name.encode() + p.read_bytes() for p in parts)).hexdigest(),
                    )
                    self._digests[f.stem] = known
                digest = known[1]
            except OSError:
                continue
            if (acked.get(f.stem) or {}).get("sha256") != digest and now - newest >= SETTLE_S:
                out.append((f.stem, digest))
        with self._lock:
            gone = set(acked) - {f.stem for _, f in files}
            for dep_id in gone:
                acked.pop(dep_id, None)
        for dep_id in set(self._digests) - {f.stem for _, f in files}:
            del self._digests[dep_id]
        return out

    def _save(self) -> None:
        """Under self._lock. A state file that cannot be written (full disk) is kept in memory; retried later."""
        try:
            atomic_write_json(self.path, self.state, mode=0o600)
        except OSError:
            pass

    def snapshot(self) -> dict[str, Any]:
        """The status document's `control_plane`: what was posted, what is pending, the last error."""
        with self._lock:
            acked = self.state["acked"]
            return {
                "url": self.port.url,
                "enrollment": self.state.get("enrollment"),
                "report": self.report,
                "posted": sum(1 for a in acked.values() if not a.get("refused")),
                "refused": {k: a["refused"] for k, a in acked.items() if a.get("refused")},
                "pending": self.pending,
                "last_posted": self.state.get("last_posted"),
                "last_error": self.last_error,
                "last_error_ts": self.last_error_ts,
                "retrying": bool(self._failures),  # the last round failed: backing off
            }


def for_agent(
    config: Any, state_dir: Path, identity: Callable[[], dict[str, Any]], on_change: Callable[[], Any], emit: Emit
) -> ControlPlaneSync | None:
    """The daemon's sync for `config.control_plane` (None without one), with the device key of `state_dir`."""
    from agent.artifacts.keys import device_key

    cp = config.control_plane
    if cp is None:
        return None
    return ControlPlaneSync(
        HttpControlPlane(cp.url),
        state_dir,
        config.device_id,
        device_key(state_dir),
        token=cp.token(),
        report=cp.report,
        retry_max_s=cp.retry_max_s,
        identity=identity,
        on_change=on_change,
        emit=emit,
    )
