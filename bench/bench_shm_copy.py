"""What reading shared memory with preadv/pwrite (the default since issue 34: a truncated region fails the request,
never the daemon) costs against the mapped, in-place path (serving.shm_in_place), on a [1, 3, 224, 224] FP32
tensor (588 KiB).

Two figures per mode, medians over interleaved rounds: SharedMemory.read of the input alone (in-process), and a
whole HTTP request to a real server (y = x + 1 over the same shape, input and output in shared memory).

    python bench/bench_shm_copy.py [--rounds 400]
"""

from __future__ import annotations

import argparse
import http.client
import json
import os
import random
import statistics
import sys
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

SHAPE = (1, 3, 224, 224)
SIZE = int(np.prod(SHAPE))
NBYTES = 4 * SIZE


def _read_cost(shm: shared_memory.SharedMemory, rounds: int) -> dict[str, float]:
    from agent.serving.shm import SharedMemory, input_slot

    planes = {"pread": SharedMemory(), "mmap": SharedMemory(in_place=True)}
    params = {"shared_memory_region": "in", "shared_memory_byte_size": NBYTES}
    slot = input_slot("x", np.dtype(np.float32), SHAPE, SIZE, params)
    for p in planes.values():
        p.register("in", "/" + shm.name, 0, NBYTES)
    times: dict[str, list[float]] = {k: [] for k in planes}
    for _ in range(rounds):
        for k in random.sample(list(planes), len(planes)):
            t = time.perf_counter()
            arr = planes[k].read(slot)
            float(arr[0, 0, 0, 0])  # touch it, as the runtime will
            times[k].append(time.perf_counter() - t)
            del arr
    for p in planes.values():
        p.close()
    return {k: statistics.median(v) * 1e6 for k, v in times.items()}


def _request_cost(a, b, rounds: int) -> dict[str, float]:
    from support.serving import oip_server, open_session

    from agent.samples import tiny_model

    doc = json.dumps(
        {
            "inputs": [
                {
                    "name": "x",
                    "shape": [1, SIZE],
                    "datatype": "FP32",
                    "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": NBYTES},
                }
            ],
            "outputs": [
                {"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": NBYTES}}
            ],
        }
    ).encode()
    times: dict[str, list[float]] = {"pread": [], "mmap": []}
    with tempfile.TemporaryDirectory() as tmp:
        s1 = open_session(tiny_model(1.0, SIZE), Path(tmp), "a.onnx")
        s2 = open_session(tiny_model(1.0, SIZE), Path(tmp), "b.onnx")
        with oip_server([("m", "1", s1)]) as copying, oip_server([("m", "1", s2)], shm_in_place=True) as inplace:
            conns = {}
            for k, srv in (("pread", copying), ("mmap", inplace)):
                c = http.client.HTTPConnection("127.0.0.1", srv.port, timeout=30)
                for name, shm in (("in", a), ("out", b)):
                    c.request(
                        "POST",
                        f"/v2/systemsharedmemory/region/{name}/register",
                        json.dumps({"key": "/" + shm.name, "byte_size": NBYTES}).encode(),
                    )
                    assert c.getresponse().read() is not None
                conns[k] = c
            for i in range(rounds + 20):
                for k in random.sample(list(conns), 2):
                    t = time.perf_counter()
                    conns[k].request("POST", "/v2/models/m/infer", doc)
                    r = conns[k].getresponse()
                    r.read()
                    assert r.status == 200, r.status
                    if i >= 20:  # warm-up
                        times[k].append(time.perf_counter() - t)
            for c in conns.values():
                c.close()
    return {k: statistics.median(v) * 1e3 for k, v in times.items()}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--rounds", type=int, default=400)
    args = ap.parse_args()
    tag = f"ea_bench_{os.getpid()}"
    a = shared_memory.SharedMemory(tag + "_in", create=True, size=NBYTES)
    b = shared_memory.SharedMemory(tag + "_out", create=True, size=NBYTES)
    try:
        np.ndarray(SHAPE, "<f4", a.buf)[:] = np.random.default_rng(0).random(SHAPE, dtype=np.float32)
        read = _read_cost(a, args.rounds * 5)
        req = _request_cost(a, b, args.rounds)
    finally:
        for s in (a, b):
            s.close()
            s.unlink()
    print(f"load average {os.getloadavg()[0]:.1f}; {SHAPE} FP32 = {NBYTES} bytes")
    print(f"SharedMemory.read: pread {read['pread']:.1f} us, mmap {read['mmap']:.1f} us")
    print(
        f"HTTP request, input and output in shared memory: pread/pwrite {req['pread']:.3f} ms, "
        f"mmap in place {req['mmap']:.3f} ms"
    )


if __name__ == "__main__":
    main()
