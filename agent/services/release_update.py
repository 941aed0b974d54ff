"""The daemon's side of `kind: agent` rollouts (issue 40): a verified desired state for `edge-agent` (the signed
manifest of a release's wheelhouse, checked like a model's by agent.sources.mqtt) is pulled over the same chunked
channel as a model, unpacked, handed to the release installer and to the guard (an `Applier`), and the trial's
result is reported in the status document's `agent_release` section, the guard's report signed by the device key
(agent.release.reports). One release at a time, on its own thread: serving and the lifecycle never wait for it.

An Applier does the install and asks for the trial: `InstallAndTrial` is the real one (agent.release.install,
then agent.release.trial.ask: golden answers recorded, guard/request.json written; the guard restarts the agent
on N+1 and flips back unless it passes). The fleet simulator has its own (agent.sim.release_sim)."""

from __future__ import annotations

import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Protocol

from agent.util.atomic import atomic_write_json, read_json

STATE_FILE = "release-update.json"  # in state_dir: the desired state handled last (digest, version, step, error)
ARTIFACT_FILE = "artifact.json"  # releases/<version>/artifact.json: the sha256 of the tar.gz it came from


class Applier(Protocol):
    def install(self, root: Path, wheelhouse: Path, version: str, trusted: dict[str, Any]) -> None:
        """Verify `wheelhouse` and install it as releases/<version>."""

    def trial(self, root: Path, version: str) -> None:
        """Have the installed releases/<version> trialled (the guard's)."""


class InstallAndTrial:
    """The real device: a side-by-side venv (agent.release.install), then the guard's trial asked for (the guard
    stops this agent soon after)."""

    def __init__(self, state_dir: Path):
        self.state_dir = state_dir

    def install(self, root: Path, wheelhouse: Path, version: str, trusted: dict[str, Any]) -> None:
        from agent.release.install import install

        base = root / "current" / "venv"
        install(root, wheelhouse, trusted, base_venv=base if base.exists() else None)

    def trial(self, root: Path, version: str) -> None:
        from agent.release.trial import ask

        ask(root, self.state_dir, version)


def root_of_running() -> Path | None:
    """The release root this agent runs from (its venv is <root>/releases/<version>/venv), else None."""
    import sys

    venv = Path(sys.prefix).resolve()
    if venv.name == "venv" and venv.parent.parent.name == "releases":
        return venv.parent.parent.parent
    return None


class ReleaseUpdater:
    def __init__(
        self,
        root: Path,
        state_dir: Path,
        applier: Applier,
        *,
        trusted: Callable[[], dict[str, Any]],
        fetch: Callable[[Any], Path],
        on_change: Callable[[], Any] = lambda: None,
        emit: Callable[[dict[str, Any]], None] = lambda record: None,
    ):
        """`fetch(manifest)`: the artifact's path once pulled and checked against its sha256 (the store's)."""
        self.root, self.state_dir, self.applier = Path(root), Path(state_dir), applier
        self.trusted, self.fetch, self.on_change, self.emit = trusted, fetch, on_change, emit
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._reports_seen: tuple[tuple[str, ...], bool] | None = None
        self._waiting: tuple[Any, str] | None = None  # offered while one was being handled: taken after it
        self._next_look = 0.0
        saved = read_json(self.state_dir / STATE_FILE, default=None)
        self.state: dict[str, Any] = saved if isinstance(saved, dict) else {}
        if self.state.get("step") in ("received", "downloading", "installing"):  # stopped midway: asked again
            self.state.update(step="failed", error="interrupted: the agent stopped during the install", digest=None)

    def _current(self) -> str | None:
        from agent_guard import links

        return links.target(self.root, links.CURRENT)

    # ---- the loop thread: a verified desired state offered, reports watched ------------------------------
    def offer(self, manifest: Any, digest: str) -> None:
        """A verified desired state for `edge-agent` (agent.sources.mqtt): handled once per digest."""
        from agent_guard import links

        with self._lock:
            if self.state.get("digest") == digest:
                return
            if self._thread is not None and self._thread.is_alive():
                self._waiting = (manifest, digest)  # the latest desired state wins, once this one is done
                return
        version = str(manifest.version)
        if version == self._current() and not (self.root / "guard" / "request.json").exists():
            self._set(digest=digest, version=version, step="done", error=None, sha256=manifest.artifact.sha256)
            return
        if links.is_bad(self.root, version):
            self._set(digest=digest, version=version, step="failed", error="the release is marked bad here")
            return
        self._set(digest=digest, version=version, step="received", error=None, sha256=manifest.artifact.sha256)
        self._thread = threading.Thread(target=self._work, args=(manifest,), name="release-update", daemon=True)
        self._thread.start()

    def tick(self) -> None:
        """A desired state that came during the last one is taken; every 2 s: a new guard report (a trial
        ended) rewrites the status, its report signed."""
        if self._waiting is not None and not (self._thread is not None and self._thread.is_alive()):
            waiting, self._waiting = self._waiting, None
            self.offer(*waiting)
        now = time.monotonic()
        if now < self._next_look:
            return
        self._next_look = now + 2.0
        seen = tuple(sorted(p.name for p in (self.root / "guard" / "reports").glob("*.json")))
        trial = (self.root / "guard" / "trial.json").exists()
        if (seen, trial) != self._reports_seen:
            self._reports_seen = (seen, trial)
            self.on_change()

    # ---- the worker: pull, unpack, install and trial ---------------------------------------------------
    def _work(self, manifest: Any) -> None:
        from agent.release.archive import unpack

        version = str(manifest.version)
        try:
            installed = (self.root / "releases" / version / "installed.json").is_file()
            with tempfile.TemporaryDirectory(prefix="release-", dir=self.state_dir) as tmp:
                wheelhouse = None
                if not installed:  # a rollback to the release kept as `previous` pulls nothing
                    self._set(step="downloading")
                    archive = self.fetch(manifest)
                    self._set(step="installing")
                    wheelhouse = unpack(archive, Path(tmp) / "wheelhouse")  # checked by the applier's verify
                    self.applier.install(self.root, wheelhouse, version, self.trusted())
                    atomic_write_json(
                        self.root / "releases" / version / ARTIFACT_FILE, {"sha256": manifest.artifact.sha256}
                    )
            self._set(step="trial-asked")  # before the trial: a real one ends this process soon after
            self.emit({"event": "agent_release", "version": version, "step": "trial-asked"})
            self.applier.trial(self.root, version)
        except Exception as exc:  # noqa: BLE001 - whatever the install meets is reported, never raised
            why = str(exc)[:500] or type(exc).__name__
            self._set(step="failed", error=why)
            self.emit({"event": "agent_release", "version": version, "ok": False, "reason": why})
        self.on_change()

    def _set(self, **fields: Any) -> None:
        with self._lock:
            self.state.update(fields, ts=time.time())
            try:
                atomic_write_json(self.state_dir / STATE_FILE, self.state)
            except OSError:
                pass  # a full disk: kept in memory, reported all the same

    # ---- the status document's `agent_release` -----------------------------------------------------------
    def section(self) -> dict[str, Any]:
        """{current, previous, sha256 (of current's archive), trial (in progress, else the last report, signed
        by the device key), installing: {version, step, error}}."""
        from agent.release.reports import sign_reports
        from agent_guard import links

        for _ in range(5):  # `current` read again after the trial: a flip in between (a trial started or ended
            # meanwhile) would pair a release with another's trial, e.g. N+1 with its own failed report: committed
            cur = self._current()
            out: dict[str, Any] = {"current": cur, "previous": links.target(self.root, links.PREVIOUS)}
            running = links.read_json(self.root / "guard" / "trial.json")
            if running is not None:
                out["trial"] = {k: running.get(k) for k in ("version", "from", "step", "try", "started")}
            else:
                reports = sign_reports(self.root, self.state_dir)
                if reports:
                    out["trial"] = reports[-1]
            if self._current() == cur:
                break
        art = read_json(self.root / "releases" / str(cur) / ARTIFACT_FILE, default=None) if cur else None
        if isinstance(art, dict) and isinstance(art.get("sha256"), str):
            out["sha256"] = art["sha256"]
        with self._lock:
            if self.state.get("version"):
                out["installing"] = {k: self.state.get(k) for k in ("version", "step", "error")}
        return out
