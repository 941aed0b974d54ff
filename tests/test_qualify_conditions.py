"""The conditions of a qualification row: its own threads' waits for the cores make it contended, read from
the kernel's per-thread run-queue figures, not inferred."""

from __future__ import annotations

import hashlib
import os
import threading

from agent.qualify import conditions


def _hash_on(cpus: set[int], data: bytes, out: list) -> None:
    os.sched_setaffinity(0, cpus)  # this thread only
    for _ in range(6):
        out.append(hashlib.sha256(data).digest())  # releases the GIL: threads hash at once


def test_threads_that_share_one_core_make_the_row_contended():
    data = os.urandom(16 << 20)
    one = {min(os.sched_getaffinity(0))}
    sampler = conditions.Sampler()
    out: list = []
    threads = [threading.Thread(target=_hash_on, args=(one, data, out)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    seen = sampler.stop()
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
