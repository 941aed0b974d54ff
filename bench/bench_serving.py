"""Serving benchmarks, each a ratio against a baseline measured in the same run (not run by the tests).

  (1) in-process ModelRegistry.infer vs raw ProviderSession.run                 goal <= 1.03x
  (2) HTTP (binary tensor extension, keep-alive client in another process) vs raw  goal <= 1.5x
  (3) 100 make-before-break swaps under 8 HTTP clients: failed requests (goal 0),
      p99 during swaps / steady p99 (goal <= 1.5), RSS after 100 swaps / after 1 (goal <= 1.05)

Usage: .venv/bin/python bench/bench_serving.py [--swaps 100] [--clients 8] [--target-ms 1.0] [--json]
Models: agent.samples.cnn_model (1 MB image input) and a MatMul chain (16 KB input), each sized so that
one run takes about --target-ms on this machine.
"""
from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.providers import get  # noqa: E402
from agent.samples import cnn_model  # noqa: E402
from agent.serving.registry import ModelRegistry  # noqa: E402
from agent.serving.server import OIPServer  # noqa: E402

OPTIONS = {"intra_op_num_threads": 1}  # serving: parallelism across requests, not inside one


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def pct(values, q):
    s = sorted(values)
    return s[max(0, int(np.ceil(q / 100 * len(s))) - 1)]


def matmul_model(layers: int, seed: int = 0, width: int = 512, rows: int = 8):
    """x[rows, width] -> (MatMul -> Relu) x layers: ~1 ms of compute on a 16 KB input."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "input"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits.append(numpy_helper.from_array(w, f"w{i}"))
        nodes += [helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]), helper.make_node("Relu", [f"m{i}"], [f"r{i}"])]
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["probabilities"]))
    graph = helper.make_graph(nodes, "matmul_chain", [helper.make_tensor_value_info("input", TensorProto.FLOAT, [rows, width])],
                              [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [rows, width])], inits)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


class Model:
    """A benchmark model: kind "cnn" (size = image side) or "matmul" (size = layers)."""

    def __init__(self, kind: str, size: int):
        self.kind, self.size = kind, size

    def __str__(self) -> str:
        return f"cnn_model(size={self.size})" if self.kind == "cnn" else f"matmul chain ({self.size} x 512x512)"

    def feeds(self) -> dict:
        shape = (1, 3, self.size, self.size) if self.kind == "cnn" else (8, 512)
        return {"input": np.random.default_rng(0).standard_normal(shape).astype(np.float32)}

    def open(self, directory: Path, seed: int = 0):
        path = directory / f"{self.kind}-{self.size}-{seed}.onnx"
        if not path.exists():
            import onnx

            model = cnn_model(seed=seed, size=self.size) if self.kind == "cnn" else matmul_model(self.size, seed)
            onnx.save(model, str(path))
        return get("cpu").open_session(path, options=OPTIONS)


def time_runs(fn, n: int) -> list[float]:
    out = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return out


def calibrate(directory: Path, kind: str, target_ms: float) -> Model:
    """The model of this kind whose single run takes about target_ms here."""
    probe = Model(kind, 128 if kind == "cnn" else 4)
    s = probe.open(directory)
    f = probe.feeds()
    time_runs(lambda: s.run(f), 20)
    ms = statistics.median(time_runs(lambda: s.run(f), 100)) * 1000
    if kind == "cnn":  # compute grows with the image area
        model = Model(kind, max(32, int(round(128 * (target_ms / ms) ** 0.5 / 16)) * 16))
    else:
        model = Model(kind, max(1, round(4 * target_ms / ms)))
    log(f"calibrate: {probe} -> {ms:.3f} ms; using {model} for ~{target_ms} ms")
    return model


# ---- (1) in-process --------------------------------------------------------------------------------
def bench_inprocess(directory: Path, model: Model, blocks: int = 15, per_block: int = 100) -> dict:
    session = model.open(directory)
    reg = ModelRegistry()
    reg.activate("m", "1", session)
    f = model.feeds()
    time_runs(lambda: session.run(f), 50)
    time_runs(lambda: reg.infer("m", f), 50)
    raw, via = [], []
    for _ in range(blocks):  # interleaved blocks: drift on a shared machine hits both sides alike
        raw.append(statistics.median(time_runs(lambda: session.run(f), per_block)))
        via.append(statistics.median(time_runs(lambda: reg.infer("m", f), per_block)))
    r, v = statistics.median(raw), statistics.median(via)
    reg.close()
    return {"raw_ms": r * 1e3, "registry_ms": v * 1e3, "ratio": v / r, "overhead_us": (v - r) * 1e6}


# ---- HTTP client (runs in a child process) -------------------------------------------------------
def _request(model: Model) -> tuple[bytes, dict]:
    x = model.feeds()["input"]
    head = json.dumps({"inputs": [{"name": "input", "shape": list(x.shape), "datatype": "FP32",
                                   "parameters": {"binary_data_size": x.nbytes}}],
                       "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}]}).encode()
    return head + x.tobytes(), {"Inference-Header-Content-Length": str(len(head)),
                                "Content-Type": "application/octet-stream"}


def _client_loop(port: int, model: Model, n: int, stop, out) -> None:
    body, headers = _request(model)
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
    conn.connect()
    samples = []
    while (n and len(samples) < n) or (not n and not stop.is_set()):
        t0, p0 = time.time(), time.perf_counter()
        try:
            conn.request("POST", "/v2/models/m/infer", body=body, headers=headers)
            r = conn.getresponse()
            r.read()
            ok = r.status == 200
        except Exception:  # noqa: BLE001 - counted as a failed request
            ok = False
            conn.close()
            conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)
        samples.append((t0, time.perf_counter() - p0, ok))
    out.put(samples)


def _client_process(port: int, kind: str, size: int, threads: int, n: int, stop, out) -> None:
    model = Model(kind, size)
    ts = [threading.Thread(target=_client_loop, args=(port, model, n, stop, out)) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


def run_clients(port: int, model: Model, threads: int, n: int = 0):
    """Start `threads` keep-alive clients in a child process: n requests each, or until collect()."""
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_client_process, args=(port, model.kind, model.size, threads, n, stop, q))
    p.start()
    p.stop = stop
    return p, q


def collect(p, q, threads: int) -> list:
    p.stop.set()
    samples = []
    for _ in range(threads):
        samples.extend(q.get(timeout=600))
    p.join(60)
    return samples


# ---- (2) HTTP vs raw -------------------------------------------------------------------------------
def bench_http(directory: Path, model: Model, n: int = 1500) -> dict:
    session = model.open(directory)
    reg = ModelRegistry()
    reg.activate("m", "1", session)
    srv = OIPServer(reg, port=0).start()
    f = model.feeds()
    time_runs(lambda: session.run(f), 50)
    raw_before = time_runs(lambda: session.run(f), n // 2)
    p, q = run_clients(srv.port, model, 1, n=n)
    http_lat = [s[1] for s in collect(p, q, 1)][100:]  # first 100: warm-up
    raw_after = time_runs(lambda: session.run(f), n // 2)
    srv.shutdown(10)
    reg.close()
    raw = raw_before + raw_after
    return {"model": str(model), "input_bytes": f["input"].nbytes,
            "raw_p50_ms": statistics.median(raw) * 1e3, "http_p50_ms": statistics.median(http_lat) * 1e3,
            "raw_mean_ms": statistics.fmean(raw) * 1e3, "http_mean_ms": statistics.fmean(http_lat) * 1e3,
            "ratio_p50": statistics.median(http_lat) / statistics.median(raw),
            "ratio_mean": statistics.fmean(http_lat) / statistics.fmean(raw)}


# ---- (3) swaps under load ------------------------------------------------------------------------
def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def bench_swaps(directory: Path, model: Model, swaps: int, clients: int, steady_s: float) -> dict:
    reg = ModelRegistry(drain_timeout=60)
    reg.activate("m", "0", model.open(directory, seed=0))
    srv = OIPServer(reg, port=0).start()
    model.open(directory, seed=1).close()  # the two model files swapped back and forth
    p, q = run_clients(srv.port, model, clients)
    time.sleep(1.0)  # clients connect and warm up (excluded from both windows)
    steady = (time.time(), time.time() + steady_s)
    time.sleep(steady_s)
    swap_t0 = time.time()
    rss, results = {}, []
    for i in range(1, swaps + 1):
        session = model.open(directory, seed=i % 2)  # make ...
        session.run(model.feeds())  # ... warm ...
        results.append(reg.activate("m", str(i), session))  # ... then break
        if i == 1:
            rss[1] = rss_mb()
    rss[swaps] = rss_mb()
    swap_t1 = time.time()
    log(f"swaps: {swaps} in {swap_t1 - swap_t0:.1f} s")
    samples = collect(p, q, clients)
    srv.shutdown(10)
    reg.close()
    in_steady = [lat for t, lat, ok in samples if steady[0] <= t < steady[1] and ok]
    in_swaps = [lat for t, lat, ok in samples if swap_t0 <= t < swap_t1 and ok]
    return {"model": str(model), "requests": len(samples), "failed": sum(1 for *_, ok in samples if not ok),
            "steady_requests": len(in_steady), "swap_requests": len(in_swaps),
            "steady_p99_ms": pct(in_steady, 99) * 1e3, "swap_p99_ms": pct(in_swaps, 99) * 1e3,
            "p99_ratio": pct(in_swaps, 99) / pct(in_steady, 99), "swap_s": swap_t1 - swap_t0,
            "rss_after_1_mb": rss[1], "rss_after_n_mb": rss[swaps], "rss_ratio": rss[swaps] / rss[1],
            "undrained": sum(1 for r in results if not r["drained"])}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--swaps", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--target-ms", type=float, default=1.0)
    ap.add_argument("--steady-s", type=float, default=5.0)
    ap.add_argument("--swap-model", choices=["cnn", "matmul"], default="cnn")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        d = Path(tmp)
        models = {k: calibrate(d, k, args.target_ms) for k in ("cnn", "matmul")}
        report = {"cpus": os.cpu_count(), "inprocess": {}, "http": {}}
        for kind, model in models.items():
            log(f"(1) in-process registry.infer vs session.run: {model} ...")
            report["inprocess"][kind] = bench_inprocess(d, model)
            log(f"(2) HTTP binary vs session.run: {model} ...")
            report["http"][kind] = bench_http(d, model)
        log(f"(3) {args.swaps} swaps under {args.clients} clients: {models[args.swap_model]} ...")
        report["swaps"] = bench_swaps(d, models[args.swap_model], args.swaps, args.clients, args.steady_s)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['cpus']} CPUs; models sized to ~{args.target_ms} ms: " + ", ".join(map(str, models.values())))
    for kind, a in report["inprocess"].items():
        print(f"(1) in-process {kind}: raw {a['raw_ms']:.3f} ms, registry {a['registry_ms']:.3f} ms -> "
              f"{a['ratio']:.3f}x (+{a['overhead_us']:.1f} us; goal <= 1.03x)")
    for kind, h in report["http"].items():
        print(f"(2) HTTP binary {kind} ({h['input_bytes'] // 1024} KB in): raw p50 {h['raw_p50_ms']:.3f} ms, "
              f"HTTP p50 {h['http_p50_ms']:.3f} ms -> {h['ratio_p50']:.3f}x (mean {h['ratio_mean']:.3f}x; goal <= 1.5x)")
    s = report["swaps"]
    print(f"(3) {args.swaps} swaps in {s['swap_s']:.1f} s, {args.clients} clients, {s['model']}: {s['requests']} requests, "
          f"{s['failed']} failed (goal 0); p99 steady {s['steady_p99_ms']:.2f} ms, during swaps {s['swap_p99_ms']:.2f} ms "
          f"-> {s['p99_ratio']:.2f} (goal <= 1.5); RSS {s['rss_after_1_mb']:.1f} -> {s['rss_after_n_mb']:.1f} MB -> "
          f"{s['rss_ratio']:.3f} (goal <= 1.05)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
