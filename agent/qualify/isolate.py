"""Run native-code work in a child process with a deadline: a crash or hang becomes a result, not our death.

The child is `python -m agent.qualify.worker FD`; tasks ("module:function", kwargs) and results travel as
pickles over a socketpair (stdout is left to the runtimes, which print there), stderr goes to a file whose
last line explains a crash. An IsolatedWorker serves many calls and restarts after a crash; run_isolated()
is the one-shot form used per provider row.
"""

from __future__ import annotations

import importlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

FAULT_ENV = "EDGE_AGENT_TEST_WORKER_FAULT"  # test-only: "abort[:tag]" or "hang[:tag]"
_CHILD_CONN: list[Connection] = []  # set inside a worker process (agent.qualify.worker)


def child_progress(event: str, **fields: Any) -> None:
    """Progress from inside an isolated task, forwarded to the parent's callback (no-op in-process)."""
    if _CHILD_CONN:
        _CHILD_CONN[0].send(("progress", event, fields))


@dataclass
class IsolatedResult:
    ok: bool
    value: Any = None
    error: str = ""  # one line: why it failed
    kind: str = ""  # "" | exception | crashed | timeout
    wall_s: float = 0.0


class IsolatedWorker:
    """A long-lived child process; call() runs a function in it with a deadline."""

    def __init__(self, env: dict[str, str] | None = None):
        self._env = env
        self._proc: subprocess.Popen | None = None
        self._conn: Connection | None = None
        self._stderr = None
        self.restarts = 0
        self._starts = 0

    def __enter__(self) -> IsolatedWorker:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def _start(self) -> None:
        parent, child = socket.socketpair()
        if self._stderr is not None:
            self._stderr.close()
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ if self._env is None else self._env)
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "agent.qualify.worker", str(child.fileno())],
            pass_fds=[child.fileno()],
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=self._stderr,
            env=env,
        )
        child.close()
        self._conn = Connection(parent.detach())

    def call(
        self,
        func: str,
        kwargs: dict[str, Any],
        *,
        timeout: float,
        tag: str = "",
        progress: Callable[..., None] | None = None,
    ) -> IsolatedResult:
        """Run `module:function(**kwargs)` in the child. Never raises for child failures."""
        if self._proc is None or self._proc.poll() is not None:
            self.restarts += 1 if self._starts else 0
            self._starts += 1
            self._start()
        t0 = time.monotonic()
        try:
            self._conn.send(("call", func, kwargs, tag))
        except (OSError, EOFError) as exc:
            return self._crashed(t0, f"could not send the task: {exc}")
        return self._wait(t0, t0 + timeout, timeout, progress)

    def _wait(self, t0: float, deadline: float, timeout: float, progress) -> IsolatedResult:
        while True:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                self._kill()
                return IsolatedResult(
                    False,
                    error=f"timed out after {timeout:.0f} s (child killed)",
                    kind="timeout",
                    wall_s=time.monotonic() - t0,
                )
            try:
                ready = self._conn.poll(min(remaining, 0.5))
                msg = self._conn.recv() if ready else None
            except (EOFError, OSError):
                return self._crashed(t0)
            if msg is None:
                if self._proc.poll() is not None and not self._conn.poll(0):
                    return self._crashed(t0)
                continue
            if msg[0] == "progress":
                if progress is not None:
                    progress(msg[1], **msg[2])
                continue
            wall = time.monotonic() - t0
            if msg[0] == "ok":
                return IsolatedResult(True, value=msg[1], wall_s=wall)
            return IsolatedResult(False, error=msg[1], kind="exception", wall_s=wall)

    def _crashed(self, t0: float, detail: str = "") -> IsolatedResult:
        code = self._proc.wait() if self._proc is not None else None
        why = describe_exit(code)
        last = self._stderr_tail()
        msg = f"worker crashed: {why}" + (f" ({detail})" if detail else "") + (f"; stderr: {last}" if last else "")
        self._proc = None
        return IsolatedResult(False, error=msg, kind="crashed", wall_s=time.monotonic() - t0)

    def _stderr_tail(self) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return lines[-1][:300] if lines else ""

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            try:
                self._conn.send(("exit",))
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


def describe_exit(code: int | None) -> str:
    if code is None:
        return "unknown exit"
    if code < 0:
        try:
            return f"killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"killed by signal {-code}"
    return f"exited with code {code}"


def run_isolated(
    func: str,
    kwargs: dict[str, Any],
    *,
    timeout: float,
    isolate: bool = True,
    tag: str = "",
    progress: Callable[..., None] | None = None,
) -> IsolatedResult:
    """One call in a fresh child (or in-process when isolate=False, for debugging and tests)."""
    if not isolate:
        t0 = time.monotonic()
        try:
            return IsolatedResult(True, value=resolve(func)(**kwargs), wall_s=time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - same contract as the child
            return IsolatedResult(
                False, error=f"{type(exc).__name__}: {exc}", kind="exception", wall_s=time.monotonic() - t0
            )
    with IsolatedWorker() as worker:
        return worker.call(func, kwargs, timeout=timeout, tag=tag, progress=progress)


def resolve(func: str) -> Callable[..., Any]:
    module, name = func.split(":")
    return getattr(importlib.import_module(module), name)
