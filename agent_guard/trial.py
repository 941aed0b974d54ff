"""One trial of a release: stop N, flip `current` to N+1, start it, and require READY=1, a connection to its
broker (when it has one), a stability window without an exit and every committed model's golden answer, all
within a deadline; otherwise flip back, start N again and count a failed try (after `max_tries`, the release is
marked bad on this device). Every step is written to guard/trial.json first, so a power cut anywhere resumes as
a failed try of N+1 with N serving."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from agent_guard import broker, golden, links


class Agent(Protocol):
    """What a trial needs of the agent's supervisor: the guard's own child (child.Child) or a systemd unit
    (sdunit.Unit)."""

    @property
    def pid(self) -> int | None: ...

    def start(self) -> object: ...

    def stop(self, timeout_s: float = 60.0) -> object: ...

    def wait_ready(self, timeout_s: float) -> str | None: ...

    def exit_reason(self) -> str | None: ...

    def idle(self) -> None: ...


@dataclass(frozen=True)
class Limits:
    ready_s: float = 120.0  # READY=1 after the start (greenboot: active within 150 s)
    stability_s: float = 10.0  # no exit for this long after READY=1 (greenboot: 60 s)
    deadline_s: float = 180.0  # the whole trial, from the start of N+1 to the last golden answer
    max_tries: int = 3  # failed tries before the release is marked bad here (greenboot: 3)
    stop_s: float = 60.0  # SIGTERM to SIGKILL when stopping N for the trial (systemd's TimeoutStopSec)
    failed_stop_s: float = 10.0  # the same for a failed N+1 before the flip back (it may well ignore SIGTERM)
    broker_s: float = 60.0  # READY=1 to a broker connection (status.json's broker.connected), when it has a broker


def step(root: Path, doc: dict[str, Any], name: str) -> None:
    doc["step"] = name
    doc.setdefault("steps", []).append([name, round(time.time(), 3)])
    links.write_json(root / "guard" / "trial.json", doc)
    if os.environ.get("EDGE_AGENT_GUARD_CRASH_AT") == name:  # tests: a power cut right after this step
        os.killpg(0, signal.SIGKILL)


def run_trial(root: Path, child: Agent, state_dir: Path, version: str, limits: Limits) -> dict[str, Any]:
    """Trial `version`; returns the report (also written to guard/reports/)."""
    old = links.target(root, links.CURRENT)
    doc: dict[str, Any] = {
        "version": version,
        "from": old,
        "started": time.time(),
        "try": links.tries(root, version) + 1,
    }
    if links.is_bad(root, version):
        return finish(root, doc, "refused", "the release is marked bad on this device")
    if not (root / "releases" / version / "installed.json").exists():
        return finish(root, doc, "refused", f"releases/{version} is not a complete install")
    step(root, doc, "stopping")
    child.stop(timeout_s=limits.stop_s)
    step(root, doc, "flipping")
    links.flip(root, version)
    step(root, doc, "starting")
    start = time.monotonic()
    try:
        child.start()
        why = child.wait_ready(min(limits.ready_s, limits.deadline_s))
    except OSError as exc:  # no venv/bin/edge-agent, not executable: as systemd's status 203/EXEC
        why = f"cannot start: {exc}"
    if why is None:
        step(root, doc, "ready")
        doc["ready_s"] = round(time.monotonic() - start, 3)
        why = _stable_and_golden(root, child, state_dir, limits, (start, doc))
    if why is None:
        step(root, doc, "good")
        links.tries_clear(root, version)
        return finish(root, doc, "good", None)
    return roll_back(root, child, doc, why, limits)


def _stable_and_golden(
    root: Path, child: Agent, state_dir: Path, limits: Limits, trial: tuple[float, dict[str, Any]]
) -> str | None:
    """Every golden answer right, the broker connected (or not applicable) and no exit for the stability
    window, before the deadline. The broker's state goes into the report (`broker`)."""
    start, doc = trial
    checks = _Checks(golden.load(root), time.monotonic())
    while True:
        ended = child.exit_reason()
        if ended:
            return f"{ended} {time.monotonic() - checks.ready_at:.1f} s after READY=1"
        now = time.monotonic()
        if checks.answered and checks.broker and now - checks.ready_at >= limits.stability_s:
            doc["broker"] = checks.broker
            return None
        if now - start > limits.deadline_s:
            return f"deadline of {limits.deadline_s:g} s passed: {checks.pending()}"
        why = checks.run(child.pid, state_dir, limits)
        if why:
            doc["broker"] = checks.broker or checks.broker_last
            return why
        child.idle()
        time.sleep(0.2)


class _Checks:
    def __init__(self, want: dict[str, Any], ready_at: float) -> None:
        self.want, self.ready_at = want, ready_at
        self.answered, self.last = False, "no golden answer yet"
        self.broker: str | None = None  # in words, once connected or not applicable
        self.broker_last = "no status yet"

    def pending(self) -> str:
        return self.last if not self.answered else f"broker: {self.broker_last}"

    def run(self, pid: int | None, state_dir: Path, limits: Limits) -> str | None:
        """The golden answers until they are right, the broker until it is connected; a failure in words."""
        if not self.answered:
            url = golden.serving_url(state_dir, pid) if pid is not None else None
            why = golden.check_all(self.want, url) if url else "status.json names no serving URL for this process"
            self.answered, self.last = why is None, why or self.last
            if why and why.startswith("model ") and "no answer" not in why and "HTTP 503" not in why:
                return f"wrong answer: {why}"
        if self.broker is None:
            since = time.monotonic() - self.ready_at
            kind, words = broker.state(state_dir, pid)
            self.broker_last = words
            if kind == broker.CONNECTED:
                self.broker = f"connected {since:.1f} s after READY=1"
            elif kind == broker.NOT_APPLICABLE:
                self.broker = words
            elif since > limits.broker_s:
                return f"cannot reach the broker: {words} {limits.broker_s:g} s after READY=1"
        return None


def roll_back(root: Path, child: Agent, doc: dict[str, Any], why: str, limits: Limits) -> dict[str, Any]:
    version, old = doc["version"], doc["from"]
    step(root, doc, "rolling-back")
    child.stop(timeout_s=limits.failed_stop_s)
    failed = links.add_try(root, version, why)
    if failed >= limits.max_tries:
        links.mark_bad(root, version, why)
        doc["marked_bad"] = True
    if old is not None:
        links.flip_back(root, version, old)
        child.start()
        doc["previous_ready"] = child.wait_ready(limits.ready_s) is None
    step(root, doc, "rolled-back")
    return finish(root, doc, "rolled-back", why)


def finish(root: Path, doc: dict[str, Any], result: str, reason: str | None) -> dict[str, Any]:
    doc.update(result=result, reason=reason, ended=time.time(), signed=False)
    doc["current"] = links.target(root, links.CURRENT)
    name = f"{int(doc['started'] * 1000)}-{doc['version']}.json"
    links.write_json(root / "guard" / "reports" / name, doc)
    (root / "guard" / "trial.json").unlink(missing_ok=True)
    (root / "guard" / "request.json").unlink(missing_ok=True)
    return doc


def recover(root: Path, max_tries: int) -> dict[str, Any] | None:
    """A trial.json left by a power cut: the trial failed; `current` goes back to the release it came from
    (None when there was none to recover)."""
    doc = links.read_json(root / "guard" / "trial.json")
    if doc is None:
        return None
    version, old = str(doc.get("version")), doc.get("from")
    why = f"interrupted at step {doc.get('step')} (power cut or guard killed)"
    if doc.get("step") == "good":
        return finish(root, doc, "good", None)
    failed = links.add_try(root, version, why)
    if failed >= max_tries:
        links.mark_bad(root, version, why)
    if isinstance(old, str):
        links.flip_back(root, version, old)
    return finish(root, doc, "rolled-back", why)
