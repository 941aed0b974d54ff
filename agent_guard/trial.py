"""One trial of a release: stop N, flip `current` to N+1, start it, and require READY=1, a stability window
without an exit and every committed model's golden answer, all within a deadline; otherwise flip back, start N
again and count a failed try (after `max_tries`, the release is marked bad on this device). Every step is
written to guard/trial.json first, so a power cut anywhere resumes as a failed try of N+1 with N serving."""

from __future__ import annotations

import os
import signal
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent_guard import golden, links
from agent_guard.child import Child


@dataclass(frozen=True)
class Limits:
    ready_s: float = 120.0  # READY=1 after the start (greenboot: active within 150 s)
    stability_s: float = 10.0  # no exit for this long after READY=1 (greenboot: 60 s)
    deadline_s: float = 180.0  # the whole trial, from the start of N+1 to the last golden answer
    max_tries: int = 3  # failed tries before the release is marked bad here (greenboot: 3)
    stop_s: float = 60.0  # SIGTERM to SIGKILL when stopping N for the trial (systemd's TimeoutStopSec)
    failed_stop_s: float = 10.0  # the same for a failed N+1 before the flip back (it may well ignore SIGTERM)


def step(root: Path, doc: dict[str, Any], name: str) -> None:
    doc["step"] = name
    doc.setdefault("steps", []).append([name, round(time.time(), 3)])
    links.write_json(root / "guard" / "trial.json", doc)
    if os.environ.get("EDGE_AGENT_GUARD_CRASH_AT") == name:  # tests: a power cut right after this step
        os.killpg(0, signal.SIGKILL)


def run_trial(root: Path, child: Child, state_dir: Path, version: str, limits: Limits) -> dict[str, Any]:
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
        why = child.notify.wait_ready(child.start(), min(limits.ready_s, limits.deadline_s))
    except OSError as exc:  # no venv/bin/edge-agent, not executable: as systemd's status 203/EXEC
        why = f"cannot start: {exc}"
    if why is None:
        step(root, doc, "ready")
        doc["ready_s"] = round(time.monotonic() - start, 3)
        why = _stable_and_golden(root, child, state_dir, limits, start)
    if why is None:
        step(root, doc, "good")
        links.tries_clear(root, version)
        return finish(root, doc, "good", None)
    return roll_back(root, child, doc, why, limits)


def _stable_and_golden(root: Path, child: Child, state_dir: Path, limits: Limits, start: float) -> str | None:
    """Every golden answer right and no exit for the stability window, before the deadline."""
    assert child.proc is not None
    want = golden.load(root)
    ready_at, answered, last = time.monotonic(), False, "no golden answer yet"
    while True:
        if child.proc.poll() is not None:
            return f"exited with status {child.proc.returncode} {time.monotonic() - ready_at:.1f} s after READY=1"
        now = time.monotonic()
        if answered and now - ready_at >= limits.stability_s:
            return None
        if now - start > limits.deadline_s:
            return f"deadline of {limits.deadline_s:g} s passed: {last}"
        if not answered:
            url = golden.serving_url(state_dir, child.proc.pid)
            why = golden.check_all(want, url) if url else "status.json names no serving URL for this process"
            answered, last = why is None, why or last
            if why and why.startswith("model ") and "no answer" not in why and "HTTP 503" not in why:
                return f"wrong answer: {why}"
        child.notify.drain()
        time.sleep(0.2)


def roll_back(root: Path, child: Child, doc: dict[str, Any], why: str, limits: Limits) -> dict[str, Any]:
    version, old = doc["version"], doc["from"]
    step(root, doc, "rolling-back")
    child.stop(timeout_s=limits.failed_stop_s)
    failed = links.add_try(root, version, why)
    if failed >= limits.max_tries:
        links.mark_bad(root, version, why)
        doc["marked_bad"] = True
    if old is not None:
        links.flip_back(root, version, old)
        proc = child.start()
        doc["previous_ready"] = child.notify.wait_ready(proc, limits.ready_s) is None
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
