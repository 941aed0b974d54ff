"""Run native-code work in a child process with a deadline: a crash or hang becomes a result, not our death.

The child is `python -m agent.isolate.worker FD [--nice N] [--data-limit BYTES] [--parent PID]`; tasks
("module:function", kwargs) and results travel as pickles over a socketpair (stdout is left to the runtimes,
which print there), stderr goes to a file whose last lines explain a crash. An IsolatedWorker serves many
calls and restarts after a crash; run_isolated() is the one-shot form used per provider row and by the
daemon for a whole qualification. This is the one child-process runner for native work: it gives back the
child's complete result or its real failure (exit status or signal, the last stderr lines), lowers the
child's priority (`nice`), bounds its memory (`memory_max`: an RSS watchdog here plus RLIMIT_DATA there, so a
runaway model kills only its worker), honours a caller's cancellation (`check`), and answers the child's
questions about the parent's state (`answers`, asked with child_ask()).
"""

from __future__ import annotations

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
from typing import IO, Any

from agent.isolate import forkserver
from agent.isolate.childside import CHILD_CONN, FAULT_ENV, resolve

__all__ = ["FAULT_ENV", "IsolatedResult", "IsolatedWorker", "child_ask", "child_progress", "resolve", "run_isolated"]

_CHILD_CONN = CHILD_CONN  # set inside a worker process (agent.isolate.worker)
STDERR_LINES = 3  # how many last stderr lines a crash report carries
WATCH_S = 0.02  # RSS sampling period of the memory watchdog
WORKER_BASE_BYTES = 384 << 20  # what a worker holds before its task allocates (Python, numpy, runtimes)
DATA_LIMIT_FACTOR = 2  # RLIMIT_DATA counts reserved (virtual) memory: the hard stop sits above the RSS cap


def child_progress(event: str, **fields: Any) -> None:
    """Progress from inside an isolated task, forwarded to the parent's callback (no-op in-process)."""
    if _CHILD_CONN:
        _CHILD_CONN[0].send(("progress", event, fields))


def child_ask(question: str) -> Any:
    """Ask the parent process (e.g. the daemon: "serving_requests"); None in-process or when nobody knows."""
    if not _CHILD_CONN:
        return None
    conn = _CHILD_CONN[0]
    conn.send(("ask", question))
    while True:
        msg = conn.recv()
        if msg[0] == "answer":
            return msg[1]


@dataclass
class IsolatedResult:
    ok: bool
    value: Any = None
    error: str = ""  # one line: why it failed
    kind: str = ""  # "" | exception | crashed | timeout | memory
    wall_s: float = 0.0
    peak_rss_bytes: int | None = None  # the worker's highest sampled RSS (with a memory watchdog)


class IsolatedWorker:
    """A long-lived child process; call() runs a function in it with a deadline."""

    def __init__(
        self,
        env: dict[str, str] | None = None,
        *,
        nice: int = 0,
        memory_max: int | None = None,
        answers: dict[str, Callable[[], Any]] | None = None,
    ):
        """`nice`: levels below our priority; `memory_max`: bytes a task may hold beyond WORKER_BASE_BYTES
        (the worker is killed over it); `answers`: question -> function, for child_ask() in the child."""
        self._env = env
        self.nice, self.memory_max, self.answers = max(0, int(nice)), memory_max, dict(answers or {})
        self._proc: subprocess.Popen[bytes] | forkserver.Forked | None = None
        self._conn: Connection | None = None
        self._stderr: IO[bytes] | None = None
        self.restarts = 0
        self._starts = 0
        self._stderr_path: str | None = None

    def _drop_stderr_path(self) -> None:
        if self._stderr_path:
            try:
                os.unlink(self._stderr_path)
            except OSError:
                pass
            self._stderr_path = None

    def __enter__(self) -> IsolatedWorker:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _start(self) -> None:
        if self._stderr is not None:
            self._stderr.close()
        limit = DATA_LIMIT_FACTOR * self.memory_max + WORKER_BASE_BYTES + (1 << 30) if self.memory_max else 0
        if forkserver.available(self._env):  # forked from a server that imported the runtimes once
            fd, path = tempfile.mkstemp(prefix="edge-agent-worker-", suffix=".stderr")
            self._stderr = os.fdopen(fd, "w+b")
            self._drop_stderr_path()
            self._stderr_path = path  # the child opens it by name; removed when the worker closes
            self._proc, self._conn = forkserver.start({"nice": self.nice, "data_limit": limit}, path)
            return
        parent, child = socket.socketpair()
        self._stderr = tempfile.TemporaryFile()
        env = dict(os.environ if self._env is None else self._env)
        argv = [sys.executable, "-m", "agent.isolate.worker", str(child.fileno()), "--parent", str(os.getpid())]
        if self.nice:
            argv += ["--nice", str(self.nice)]
        if limit:
            argv += ["--data-limit", str(limit)]
        self._proc = subprocess.Popen(
            argv,
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
        check: Callable[[], None] | None = None,
    ) -> IsolatedResult:
        """Run `module:function(**kwargs)` in the child. Never raises for child failures; an exception from
        `check()` (called while waiting: the caller's cancellation) kills the child and propagates."""
        if self._proc is None or self._proc.poll() is not None:
            self.restarts += 1 if self._starts else 0
            self._starts += 1
            self._start()
        t0 = time.monotonic()
        assert self._conn is not None
        try:
            self._conn.send(("call", func, kwargs, tag))
        except (OSError, EOFError) as exc:
            return self._crashed(t0, f"could not send the task: {exc}")
        try:
            return _Wait(self, t0, timeout, progress, check).run()
        except BaseException:
            self._kill()
            raise

    def _answer(self, question: str) -> Any:
        fn = self.answers.get(question)
        if fn is not None:
            try:
                return fn()
            except Exception:  # noqa: BLE001 - an answer is evidence; a broken one is "unknown"
                return None
        return child_ask(question)  # a worker inside a worker: pass the question up

    def _crashed(self, t0: float, detail: str = "") -> IsolatedResult:
        code = self._proc.wait() if self._proc is not None else None
        why = describe_exit(code)
        last = self._stderr_tail()
        msg = f"worker crashed: {why}" + (f" ({detail})" if detail else "") + (f"; stderr: {last}" if last else "")
        self._proc = None
        return IsolatedResult(False, error=msg, kind="crashed", wall_s=time.monotonic() - t0)

    def _stderr_tail(self, lines_wanted: int = STDERR_LINES) -> str:
        if self._stderr is None:
            return ""
        try:
            self._stderr.seek(0)
            lines = [ln.strip() for ln in self._stderr.read().decode(errors="replace").splitlines() if ln.strip()]
        except OSError:
            return ""
        return " | ".join(ln[:300] for ln in lines[-lines_wanted:])

    def rss(self) -> int | None:
        """The worker's resident set size in bytes (None when it is not running or cannot be read)."""
        if self._proc is None:
            return None
        try:
            import psutil

            return int(psutil.Process(self._proc.pid).memory_info().rss)
        except Exception:  # noqa: BLE001 - psutil.NoSuchProcess, AccessDenied, ImportError
            return None

    def _kill(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.kill()
            self._proc.wait()
        self._proc = None
        if self._conn is not None:
            self._conn.close()
            self._conn = None

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None and self._conn is not None:
            try:
                self._conn.send(("exit",))
                self._proc.wait(timeout=5)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self._kill()
        self._drop_stderr_path()
        if self._stderr is not None:
            self._stderr.close()
            self._stderr = None


class _Wait:
    """One call's wait: results, progress and questions from the child; deadline, cancellation, memory."""

    def __init__(
        self,
        worker: IsolatedWorker,
        t0: float,
        timeout: float,
        progress: Callable[..., None] | None,
        check: Callable[[], None] | None,
    ) -> None:
        self.w, self.t0, self.timeout, self.progress, self.check = worker, t0, timeout, progress, check
        self.deadline = t0 + timeout
        self.peak: int | None = None

    def run(self) -> IsolatedResult:
        w = self.w
        conn, proc = w._conn, w._proc
        assert conn is not None and proc is not None  # call() started the worker
        period = WATCH_S if w.memory_max else 0.5
        while True:
            if self.check is not None:
                self.check()
            remaining = self.deadline - time.monotonic()
            if remaining <= 0:
                w._kill()
                return self._result(False, error=f"timed out after {self.timeout:.0f} s (child killed)", kind="timeout")
            over = self._over_memory()
            if over:
                w._kill()
                return self._result(False, error=over, kind="memory")
            try:
                ready = conn.poll(min(remaining, period))
                msg = conn.recv() if ready else None
            except (EOFError, OSError):
                return self._crashed()
            if msg is None:
                if proc.poll() is not None and not conn.poll(0):
                    return self._crashed()
                continue
            if msg[0] == "progress":
                if self.progress is not None:
                    self.progress(msg[1], **msg[2])
            elif msg[0] == "ask":
                conn.send(("answer", w._answer(msg[1])))
            elif msg[0] == "ok":
                return self._result(True, value=msg[1])
            else:
                return self._result(False, error=msg[1], kind="exception")

    def _crashed(self) -> IsolatedResult:
        res = self.w._crashed(self.t0)
        res.peak_rss_bytes = self.peak
        return res

    def _result(self, ok: bool, **fields: Any) -> IsolatedResult:
        return IsolatedResult(ok, wall_s=time.monotonic() - self.t0, peak_rss_bytes=self.peak, **fields)

    def _over_memory(self) -> str:
        """The watchdog: the worker's RSS against memory_max plus what the runtimes themselves hold."""
        cap = self.w.memory_max
        if not cap:
            return ""
        rss = self.w.rss()
        if rss is None:
            return ""
        self.peak = max(self.peak or 0, rss)
        if rss <= cap + WORKER_BASE_BYTES:
            return ""
        return (
            f"memory: the worker's RSS reached {size_text(rss)} > serving.memory_max {size_text(cap)} "
            f"+ {size_text(WORKER_BASE_BYTES)} for the runtime itself; the worker was killed"
        )


def size_text(n: int) -> str:
    """Bytes for people: 1.5 GiB, 300 MiB, 12 KiB."""
    for unit, shift in (("GiB", 30), ("MiB", 20), ("KiB", 10)):
        if abs(n) >= 1 << shift:
            return f"{n / (1 << shift):.{1 if unit == 'GiB' else 0}f} {unit}"
    return f"{n} B"


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
    check: Callable[[], None] | None = None,
    nice: int = 0,
    memory_max: int | None = None,
    answers: dict[str, Callable[[], Any]] | None = None,
) -> IsolatedResult:
    """One call in a fresh child (or in-process when isolate=False, for debugging and tests: no memory
    bound, no priority change)."""
    if not isolate:
        t0 = time.monotonic()
        try:
            return IsolatedResult(True, value=resolve(func)(**kwargs), wall_s=time.monotonic() - t0)
        except Exception as exc:  # noqa: BLE001 - same contract as the child
            return IsolatedResult(
                False, error=f"{type(exc).__name__}: {exc}", kind="exception", wall_s=time.monotonic() - t0
            )
    with IsolatedWorker(nice=nice, memory_max=memory_max, answers=answers) as worker:
        return worker.call(func, kwargs, timeout=timeout, tag=tag, progress=progress, check=check)
