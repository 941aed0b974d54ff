#!/usr/bin/env python3
"""Run a module under cProfile in every thread (the control plane's fleet loop and request workers are threads;
`python -m cProfile` sees only the main one), the merged stats written to OUT when it exits.

    .venv/bin/python bench/cp_profile.py OUT.pstats -m agent control-plane --config CFG

Used by bench/cp_scale.py --profile and bench/cp_ops.py --profile; read the result with `python -m pstats
OUT.pstats` (sort cumtime, stats 40). Times are wall time per thread (a wait for the database counts); with
EDGE_PROFILE_CPU=1 in the environment they are each thread's CPU time instead (where the service's CPU goes).
"""

from __future__ import annotations

import atexit
import cProfile
import os
import pstats
import runpy
import sys
import threading
import time

PROFILES: list[cProfile.Profile] = []
LOCK = threading.Lock()


def _start_in_thread(*_args) -> None:
    prof = cProfile.Profile(time.thread_time) if os.environ.get("EDGE_PROFILE_CPU") == "1" else cProfile.Profile()
    with LOCK:
        PROFILES.append(prof)
    prof.enable()  # replaces this hook for the thread: cProfile from here on


def _dump(out: str) -> None:
    with LOCK:
        profs = list(PROFILES)
    for p in profs:
        p.disable()  # stops the calling thread's; the others' collected calls are read as they are
    stats = None
    for p in profs:
        try:
            stats = pstats.Stats(p) if stats is None else stats.add(p)
        except (TypeError, ValueError):  # a profile that collected nothing
            continue
    if stats is not None:
        stats.dump_stats(out)


def main() -> None:
    out, flag, module, *rest = sys.argv[1:]
    if flag != "-m":
        raise SystemExit(__doc__)
    threading.setprofile(_start_in_thread)
    atexit.register(_dump, out)
    _start_in_thread()
    sys.argv = [module, *rest]
    runpy.run_module(module, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
