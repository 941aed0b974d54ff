"""The conditions of a qualification row: its own threads' waits for the cores make it contended, read from
the kernel's per-thread run-queue figures, not inferred."""

from __future__ import annotations

import hashlib
import os
import threading

from agent.qualify import conditions


def _hash_on(cpus: set[int], data: bytes, out: list, done: threading.Barrier, leave: threading.Event) -> None:
    os.sched_setaffinity(0, cpus)  # this thread only
    for _ in range(6):
        out.append(hashlib.sha256(data).digest())  # releases the GIL: threads hash at once
    done.wait(120)
    leave.wait(120)  # alive until the row's conditions are read: a thread that ended takes its figures along


def test_threads_that_share_one_core_make_the_row_contended():
    data = os.urandom(16 << 20)
    one = {min(os.sched_getaffinity(0))}
    done, leave = threading.Barrier(3), threading.Event()
    out: list = []
    threads = [threading.Thread(target=_hash_on, args=(one, data, out, done, leave)) for _ in range(2)]
    sampler = conditions.Sampler()
    for t in threads:
        t.start()
    try:
        done.wait(120)
        seen = sampler.stop()
    finally:
        leave.set()
        for t in threads:
            t.join(120)
    assert len(out) == 12
    # two threads runnable on one core: each waited for about as long as the other ran
    assert seen["own_wait_share"] is not None and seen["own_wait_share"] > 0.3, seen
    assert conditions.contended(seen)


def test_a_row_whose_threads_had_the_cores_is_not_contended_by_its_waits():
    quiet = {"others_cpu_share": 0.0, "own_wait_share": 0.01, "throttled": None}
    assert not conditions.contended(quiet)
    assert conditions.contended({**quiet, "own_wait_share": 0.2})
    assert not conditions.contended({**quiet, "own_wait_share": None})  # the kernel did not say
    assert conditions.contended({**quiet, "others_cpu_share": 0.5})
