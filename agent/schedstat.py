"""How long threads waited on a run queue: runnable, not running (Linux, /proc/self/task/<tid>/schedstat, its
second field in ns; it needs CONFIG_SCHED_INFO, not the schedstats sysctl). A wait is time a thread wanted a
core and another task had it: serving drops the CPU time of a run whose threads waited (serving/rungate.py),
and a qualification row whose threads waited is contended (qualify/conditions.py)."""

from __future__ import annotations

import os
import threading

_TASKS = "/proc/self/task"
AVAILABLE = os.path.exists(f"{_TASKS}/{os.getpid()}/schedstat")

# Open schedstat files by thread id: pread on an open one costs ~1 us, open/read/close ~7 us here. A thread that
# ended fails its read (its id is then opened afresh, should it be reused); the ones not read since are closed
# once the cache outgrows the process's threads.
_SCHED_FDS: dict[int, int] = {}
_SCHED_LOCK = threading.Lock()


def _forget_sched_fds() -> None:
    """In a forked child: its threads are not its parent's, it opens its own."""
    for fd in _SCHED_FDS.values():
        try:
            os.close(fd)
        except OSError:
            pass
    _SCHED_FDS.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_sched_fds)


def _sched_read(tid: int) -> bytes:
    fd = _SCHED_FDS.get(tid)
    if fd is not None:
        try:
            return os.pread(fd, 128, 0)
        except OSError:  # the thread ended
            with _SCHED_LOCK:
                if _SCHED_FDS.get(tid) == fd:
                    del _SCHED_FDS[tid]
                    os.close(fd)
    with _SCHED_LOCK:
        alive = set(map(int, os.listdir(_TASKS)))
        if len(_SCHED_FDS) > 4 * len(alive) + 16:
            for old in [t for t in _SCHED_FDS if t not in alive]:
                os.close(_SCHED_FDS.pop(old))
        fd = _SCHED_FDS.get(tid)
        if fd is None:
            fd = _SCHED_FDS[tid] = os.open(f"{_TASKS}/{tid}/schedstat", os.O_RDONLY | os.O_CLOEXEC)
    return os.pread(fd, 128, 0)


def run_queue_wait_s() -> float | None:
    """Seconds all of this process's threads have waited on a run queue so far, summed (None where the kernel
    does not say). Threads that ended are not in it: compare two readings over threads that live across both."""
    if not AVAILABLE:
        return None
    return run_delay(map(int, os.listdir(_TASKS)))


def run_delay(tids) -> float:
    """Seconds the threads have waited on a run queue, runnable but not running (the second field of each
    thread's /proc schedstat; a thread that ended meanwhile reads 0)."""
    total = 0
    for tid in tids:
        try:
            total += int(_sched_read(tid).split()[1])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9
