"""Background work that yields the CPU to serving: a thread at a higher nice value, priorities restored after.

Building and warming the next model version (graph optimisation, weight pre-packing, OpenVINO compilation)
competes with the serving threads for the few cores of an edge device; measured on 2 cores under 8 clients,
a swap at serving priority raises p99 by 1.3-1.8x, a nice 10-19 build by about 1.2x. On Linux a thread
inherits its creator's nice value, so runtime thread pools started during the build (ORT intra-op pools,
OpenVINO/TBB workers) would keep the low priority forever: every thread that appears during the build is set
back afterwards. Lowering a nice value needs CAP_SYS_NICE or RLIMIT_NICE (systemd: LimitNICE=+0), so the
build runs at low priority only where that restore is known to work, and says why not otherwise.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")
_TASKS = "/proc/self/task"
SETTLE_S = 0.5  # after a build, threads that appear within this time are checked too ...
QUIET_S = 0.1  # ... until none has needed a restore for this long
_restorable: tuple[bool, str] | None = None


def _threads() -> set[int]:
    try:
        return {int(t) for t in os.listdir(_TASKS)}
    except (OSError, ValueError):
        return set()


def can_restore() -> tuple[bool, str]:
    """Can this process lower a thread's nice value back after raising it? (checked once, on a probe thread)"""
    global _restorable
    if _restorable is not None:
        return _restorable
    if not hasattr(os, "setpriority") or not hasattr(threading, "get_native_id") or not os.path.isdir(_TASKS):
        _restorable = (False, "per-thread priorities need Linux")
        return _restorable
    try:  # an unprivileged process may raise its soft RLIMIT_NICE up to the hard limit
        import resource

        soft, hard = resource.getrlimit(resource.RLIMIT_NICE)
        if hard == resource.RLIM_INFINITY or soft < hard:
            resource.setrlimit(resource.RLIMIT_NICE, (hard, hard))
    except (ImportError, AttributeError, ValueError, OSError):
        pass
    box: dict[str, str] = {}

    def probe() -> None:
        tid = threading.get_native_id()
        base = os.getpriority(os.PRIO_PROCESS, tid)
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, base + 1))
            os.setpriority(os.PRIO_PROCESS, tid, base)
        except OSError as exc:
            box["why"] = (
                f"cannot restore a thread's priority ({exc.strerror}): building at serving priority; "
                "grant CAP_SYS_NICE or RLIMIT_NICE (systemd: LimitNICE=+0)"
            )

    t = threading.Thread(target=probe, name="priority-probe")
    t.start()
    t.join()
    _restorable = (False, box["why"]) if "why" in box else (True, "ok")
    return _restorable


def _restore(old: set[int], base: int, settle_s: float = SETTLE_S) -> int:
    """Set every thread not in `old` back to `base`, rescanning for settle_s: runtimes also start workers
    asynchronously (TBB's thread creation), and a worker started by a still-lowered thread is lowered too.
    Returns how many threads could not be restored."""
    failed: set[int] = set()
    start = time.monotonic()
    while True:
        lowered = 0
        for tid in _threads() - old - failed:
            try:
                if os.getpriority(os.PRIO_PROCESS, tid) != base:
                    lowered += 1
                    os.setpriority(os.PRIO_PROCESS, tid, base)
            except OSError:  # the thread ended meanwhile, or the restore was refused
                if tid in _threads():
                    failed.add(tid)
        elapsed = time.monotonic() - start
        if elapsed >= settle_s or (not lowered and elapsed >= QUIET_S):  # quiet for QUIET_S: nothing more coming
            return len(failed)
        time.sleep(0.02)


def run_lowered(fn: Callable[[], T], nice: int) -> tuple[T, str]:
    """Run fn() in a thread `nice` levels below the caller; returns (fn's result, how it ran). fn's exception
    is re-raised here. Threads started during fn and still alive get the caller's priority back."""
    if nice <= 0:
        return fn(), "serving priority"
    ok, why = can_restore()
    if not ok:
        return fn(), why
    base = os.getpriority(os.PRIO_PROCESS, threading.get_native_id())
    before = _threads()
    box: dict[str, object] = {}

    def work() -> None:
        tid = threading.get_native_id()
        try:
            os.setpriority(os.PRIO_PROCESS, tid, min(19, base + nice))
            box["value"] = fn()
        except BaseException as exc:  # noqa: BLE001 - re-raised in the caller's thread
            box["error"] = exc
        finally:  # back to serving priority before exiting: runtime thread-exit hooks (TBB) may take a while
            try:
                os.setpriority(os.PRIO_PROCESS, tid, base)
            except OSError:
                pass

    t = threading.Thread(target=work, name="build-lowered")
    t.start()
    t.join()
    failed = _restore(before, base)
    if "error" in box:
        raise box["error"]  # type: ignore[misc]
    note = f"nice +{nice}" + (f"; {failed} runtime thread(s) kept the lower priority" if failed else "")
    return box["value"], note  # type: ignore[return-value]
