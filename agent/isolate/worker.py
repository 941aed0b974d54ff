"""Child-process entry point for isolate.py: `python -m agent.isolate.worker FD [options]` serves calls until told
to exit. Options: --parent PID (die with it), --nice N (run N levels lower), --data-limit BYTES (RLIMIT_DATA)."""

from __future__ import annotations

import os
import signal
import sys
import time
import traceback
from multiprocessing.connection import Connection

from agent.errors import without_source_locations
from agent.isolate.childside import CHILD_CONN, FAULT_ENV, resolve


def _inject_fault(tag: str) -> None:
    """Test-only hook: EDGE_AGENT_TEST_WORKER_FAULT=abort|hang|exit0[:tag] makes this task crash, hang or exit
    without a result (exit-after[:tag]: the worker exits right after sending the result)."""
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
    if action == "exit0":
        sys.stderr.write("test fault: leaving without a result\n")
        sys.stderr.flush()
        os._exit(0)


def serve(conn: Connection) -> None:
    CHILD_CONN[:] = [conn]
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
            if os.environ.get(FAULT_ENV, "") in ("exit-after", f"exit-after:{tag}"):
                os._exit(0)  # test-only: the result is on its way, the process is gone
        except Exception as exc:  # noqa: BLE001 - reported to the parent as a row, never raised there
            traceback.print_exc(file=sys.stderr)  # the source location stays in the worker's stderr, not the reason
            text = without_source_locations(str(exc).strip())
            conn.send(("error", f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")))


def apply_options(options: dict[str, int]) -> None:
    """Die with the parent (Linux PDEATHSIG), lower the priority, cap the data segment: before any import."""
    parent = options.get("parent")
    if parent:
        try:
            import ctypes

            ctypes.CDLL(None).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
        except (OSError, AttributeError):
            pass
        if os.getppid() != parent:
            os._exit(3)  # the parent died before PDEATHSIG was armed
    if options.get("nice"):
        try:
            os.nice(options["nice"])
        except OSError:
            pass
    if options.get("data_limit"):
        try:
            import resource

            limit = options["data_limit"]
            _, hard = resource.getrlimit(resource.RLIMIT_DATA)
            if hard != resource.RLIM_INFINITY:
                limit = min(limit, hard)
            resource.setrlimit(resource.RLIMIT_DATA, (limit, hard))
        except (ImportError, ValueError, OSError):
            pass


def _options(argv: list[str]) -> dict[str, int]:
    out: dict[str, int] = {}
    for flag, value in zip(argv[::2], argv[1::2]):
        out[flag.lstrip("-").replace("-", "_")] = int(value)
    return out


if __name__ == "__main__":
    apply_options(_options(sys.argv[2:]))
    serve(Connection(int(sys.argv[1])))
