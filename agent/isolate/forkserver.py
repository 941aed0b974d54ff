"""Row workers forked from a server that imported the runtimes once (multiprocessing's forkserver).

A fresh `python -m agent.isolate.worker` per row pays interpreter start-up and the numpy / onnxruntime /
OpenVINO imports every time; on a small model that is most of a qualification's wall time. The forkserver
imports them once, before any session or thread pool exists, and forks a clean process per worker: a crash
still kills only that child (a row), the child's memory and thread pools start empty, and start-up costs a
fork. The child applies the same options as a spawned worker (priority, RLIMIT_DATA, dies with its parent)
and writes its stderr to the file the parent reads a crash's last lines from. The child gets the caller's
environment as it is at the fork (what a library read while the server imported it stays as it was then).

Used on Linux when the caller passes no environment of its own (a worker with another environment is spawned);
EDGE_AGENT_SPAWN_WORKERS=1 spawns every worker (the former way, for comparison).
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from multiprocessing.connection import Connection
from typing import Any

SPAWN_ENV = "EDGE_AGENT_SPAWN_WORKERS"
# agent.isolate.lifeline first: the server exits with its starter (a SIGKILLed caller leaves nothing behind)
PRELOAD = [
    "agent.isolate.lifeline",
    "numpy",
    "onnx",
    "onnxruntime",
    "openvino",
    "agent.qualify.rowtask",
    "agent.isolate.worker",
]
_CONTEXT: list[Any] = []
_LOCK = threading.Lock()  # one start at a time: __main__ is hidden meanwhile
WORKER_NAME = "edge-worker"  # the forked child's process name (15 bytes at most)
KEPT_NAME = "edge-kept"  # a row worker idle with its row's session, kept for the confirmation round (keptrows)


def available(env: dict[str, str] | None) -> bool:
    return env is None and sys.platform.startswith("linux") and os.environ.get(SPAWN_ENV, "") in ("", "0")


def _context() -> Any:
    if not _CONTEXT:
        import multiprocessing as mp

        ctx = mp.get_context("forkserver")
        ctx.set_forkserver_preload(PRELOAD)  # a module that fails to import is skipped by the server
        _CONTEXT.append(ctx)
    return _CONTEXT[0]


def prewarm() -> None:
    """Start the server now, without waiting for it: it imports the runtimes while the caller loads the package,
    probes the providers and computes the reference, so the first row's fork does not wait for those imports.
    Nothing happens where workers are spawned, or when the server already runs (a daemon's)."""
    if not available(None):
        return
    from multiprocessing import forkserver as mp_forkserver

    _context()
    with _LOCK, _main_hidden():  # the server would otherwise import the caller's __main__ too
        mp_forkserver.ensure_running()


class Forked:
    """The Popen calls IsolatedWorker makes (pid, poll, wait, kill) over a forkserver child."""

    def __init__(self, proc: Any) -> None:
        self._p = proc
        self.pid = proc.pid

    def poll(self) -> int | None:
        code: int | None = self._p.exitcode
        return code

    def wait(self, timeout: float | None = None) -> int:
        self._p.join(timeout)
        if self._p.exitcode is None:
            raise subprocess.TimeoutExpired("forked worker", timeout or 0)
        return int(self._p.exitcode)

    def kill(self) -> None:
        self._p.kill()


def start(options: dict[str, int], stderr_path: str) -> tuple[Forked, Connection]:
    """Fork a worker from the server; (process, our end of its connection)."""
    ctx = _context()
    ours, theirs = ctx.Pipe(duplex=True)
    env = dict(os.environ)  # the caller's environment now, as a spawned worker would get it
    priority = os.getpriority(os.PRIO_PROCESS, 0) + int(options.get("nice") or 0)
    proc = ctx.Process(
        target=child_main,
        args=(theirs, {**options, "priority": priority}, stderr_path, env),
        name="edge-agent-worker",
        daemon=True,  # never joined at our exit: terminated, as a spawned worker dies with us (PDEATHSIG)
    )
    with _LOCK, _main_hidden():
        proc.start()
    theirs.close()
    return Forked(proc), ours


@contextmanager
def _main_hidden() -> Iterator[None]:
    """multiprocessing re-runs the caller's __main__ in the child (as __mp_main__) so that functions defined
    there resolve; the worker's entry lives here, so the child must not run a script or stdin again."""
    main = sys.modules.get("__main__")
    saved = {k: getattr(main, k) for k in ("__file__", "__spec__") if hasattr(main, k)}
    try:
        for k in saved:
            if k == "__file__":
                delattr(main, k)
            else:
                setattr(main, k, None)
        yield
    finally:
        for k, v in saved.items():
            setattr(main, k, v)


def set_name(name: str) -> None:
    """This process's name as `ps` and /proc/PID/comm show it (Linux; elsewhere nothing)."""
    try:
        import ctypes

        ctypes.CDLL(None).prctl(15, name.encode(), 0, 0, 0)  # PR_SET_NAME
    except (OSError, AttributeError):
        pass


def child_main(conn: Connection, options: dict[str, int], stderr_path: str, env: dict[str, str]) -> None:
    """In the forked child: its name, stdout to /dev/null, stderr to the parent's file, the worker's options,
    serve."""
    import multiprocessing

    multiprocessing.current_process().daemon = False  # a worker may start workers (the daemon's qualification)
    set_name(WORKER_NAME)  # `ps` and /proc/PID/comm show what it is (it shares the server's command line)
    fd = os.open(stderr_path, os.O_WRONLY | os.O_APPEND)
    os.dup2(fd, 2)
    os.close(fd)
    null = os.open(os.devnull, os.O_WRONLY)
    os.dup2(null, 1)
    os.close(null)
    os.environ.clear()
    os.environ.update(env)
    from agent.isolate import worker

    priority = options.pop("priority", None)
    if priority is not None:
        try:  # absolute: the server's own priority is whatever its starter's thread had
            os.setpriority(os.PRIO_PROCESS, 0, min(19, priority))
        except OSError:
            pass
    worker.apply_options({**options, "nice": 0, "parent": os.getppid()})
    worker.serve(conn)
