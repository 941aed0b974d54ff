"""Child-process entry point for isolate.py: `python -m agent.qualify.worker FD` serves calls until told to exit."""

from __future__ import annotations

import os
import sys
import time
import traceback
from multiprocessing.connection import Connection

from agent.qualify import isolate
from agent.qualify.isolate import FAULT_ENV, resolve


def _inject_fault(tag: str) -> None:
    """Test-only hook: EDGE_AGENT_TEST_WORKER_FAULT=abort|hang[:tag] makes this task crash or hang."""
    spec = os.environ.get(FAULT_ENV, "")
    if not spec:
        return
    action, _, only = spec.partition(":")
    if only and only != tag:
        return
    if action == "abort":
        os.abort()
    if action == "hang":
        time.sleep(3600)


def die_with_parent() -> None:
    """Linux: SIGKILL this worker when the process that started it dies (even by SIGKILL), so a busy worker
    never outlives a stopped conformance run or daemon. Elsewhere the closed socket ends an idle worker."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes
    import signal

    parent = os.getppid()
    try:
        ctypes.CDLL(None, use_errno=True).prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    if os.getppid() != parent:  # the parent died before prctl took effect
        os._exit(1)


def serve(conn: Connection) -> None:
    isolate._CHILD_CONN[:] = [conn]
    while True:
        try:
            msg = conn.recv()
        except (EOFError, OSError):
            return
        if msg[0] == "exit":
            return
        _, func, kwargs, tag = msg
        _inject_fault(tag)
        try:
            conn.send(("ok", resolve(func)(**kwargs)))
        except Exception as exc:  # noqa: BLE001 - reported to the parent as a row, never raised there
            tb = traceback.extract_tb(exc.__traceback__)
            where = f" at {os.path.basename(tb[-1].filename)}:{tb[-1].lineno}" if tb else ""
            conn.send(
                (
                    "error",
                    f"{type(exc).__name__}: {str(exc).strip().splitlines()[0] if str(exc).strip() else ''}{where}",
                )
            )


if __name__ == "__main__":
    die_with_parent()
    serve(Connection(int(sys.argv[1])))
