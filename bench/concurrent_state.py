"""Does a session run faster alone after other threads ran it? (issue 36, docs/serving.md "Paired timing": a
finding on Intel Xeon with AVX-512 and AMX, 2 cores.) Two ORT CPU sessions, intra-op 1: the 1x chain and its 2x
twin (tests/probation_models.py, depth 16, ~2.5 ms); N client threads run the 2x session; before each timed pair
they are held and every run in flight ends (nothing else runs in the process), then one 1x and one 2x run are timed
by the thread's CPU clock, ABBA. Plain onnxruntime, no agent code.

    .venv/bin/python bench/concurrent_state.py N [GAP_S]   # e.g. 0, then 4: both medians and their ratio
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path

import numpy as np
import onnxruntime as ort

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))
from probation_models import WIDTH, chain_model  # noqa: E402


def main(clients: int, gap: float, pairs: int = 150) -> None:
    so = ort.SessionOptions()
    so.intra_op_num_threads, so.log_severity_level = 1, 3
    one = ort.InferenceSession(chain_model(depth=16).SerializeToString(), so, providers=["CPUExecutionProvider"])
    two = ort.InferenceSession(
        chain_model(depth=16, redundant=True).SerializeToString(), so, providers=["CPUExecutionProvider"]
    )
    x = {"x": np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)}
    cond, stop = threading.Condition(), threading.Event()
    state = {"hold": False, "inflight": 0}

    def client() -> None:
        while not stop.is_set():
            with cond:
                cond.wait_for(lambda: not state["hold"])
                state["inflight"] += 1
            two.run(None, x)
            with cond:
                state["inflight"] -= 1
                cond.notify_all()

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    times: dict[int, list[float]] = {1: [], 2: []}
    for i in range(pairs):
        with cond:
            state["hold"] = True
            cond.wait_for(lambda: state["inflight"] == 0)
        time.sleep(gap)
        for k, session in ((1, one), (2, two)) if i % 2 else ((2, two), (1, one)):
            t0 = time.thread_time()
            session.run(None, x)
            times[k].append(time.thread_time() - t0)
        with cond:
            state["hold"] = False
            cond.notify_all()
        time.sleep(0.01)
    stop.set()
    with cond:
        state["hold"] = False
        cond.notify_all()
    for t in threads:
        t.join(5)
    ratio = np.median(np.array(times[2]) / np.array(times[1]))
    print(
        f"{clients} client threads on the 2x session: 1x {1e3 * np.median(times[1]):.3f} ms, "
        f"2x {1e3 * np.median(times[2]):.3f} ms CPU alone, paired ratio {ratio:.3f}"
    )


if __name__ == "__main__":
    main(int(sys.argv[1]), float(sys.argv[2]) if len(sys.argv) > 2 else 0.0)
