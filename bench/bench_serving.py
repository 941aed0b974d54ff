"""Serving benchmarks, each a ratio against a baseline measured in the same run (not run by the tests).

  (1) in-process ModelRegistry.infer vs raw onnxruntime InferenceSession.run       goal <= 1.03x
  (2) HTTP (binary tensor extension, keep-alive client in another process) vs raw  goal <= 1.5x
  (3) 100 make-before-break swaps under 8 HTTP clients: failed requests (goal 0),
      p99 during swaps / steady p99 (goal <= 1.5), RSS after 100 swaps / after 1 (goal <= 1.05)

Usage: .venv/bin/python bench/bench_serving.py [--swaps 100] [--clients 8] [--target-ms 1.0] [--swap-model cnn|matmul]
                                               [--build-nice 10] [--json]
"Raw" is what a user of onnxruntime writes: InferenceSession.run(None, feeds) on the same session object.
Raw and served calls are timed back to back in random order and compared pair by pair (median of the
differences), so load drift on a shared machine and cache-order effects hit both sides alike.
Models: agent.samples.cnn_model (image input) and a MatMul chain (16 KB input), each sized so that one run
takes about --target-ms on this machine.
(1) is measured in the steady state (a version past its first 1000 responses: 1 in 16 checked for NaN/Inf)
and again as on probation (every response checked), which is printed beside it.
(2) is measured with a lean keep-alive client (one sendmsg per request, Content-Length framing), so that the
figure is the server's cost, as with perf_analyzer's C++ client; the same requests through Python's
http.client are printed beside it (that client's own parsing costs ~150-250 us per request here).
(3) builds each new session the way the daemon does (agent.util.priority.run_lowered at serving.build_nice,
default 10: the compile yields to serving; --build-nice 0 builds at serving priority).
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from agent.providers import get  # noqa: E402
from agent.samples import cnn_model  # noqa: E402
from agent.serving.http.server import OIPServer  # noqa: E402
from agent.serving.memory import MMAP_THRESHOLD, fix_mmap_threshold, limit_malloc_arenas  # noqa: E402
from agent.serving.metrics import FINITE_FIRST  # noqa: E402
from agent.serving.registry import ModelRegistry  # noqa: E402
from agent.util.priority import run_lowered  # noqa: E402

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
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"]),
            helper.make_node("Relu", [f"m{i}"], [f"r{i}"]),
        ]
        prev = f"r{i}"
    nodes.append(helper.make_node("Identity", [prev], ["probabilities"]))
    graph = helper.make_graph(
        nodes,
        "matmul_chain",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, [rows, width])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [rows, width])],
        inits,
    )
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


def raw_run(session, feeds: dict) -> Callable[[], object]:
    """The baseline: onnxruntime's public InferenceSession.run on the session the registry serves."""
    ort_session = session._sess
    return lambda: ort_session.run(None, feeds)


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
    else:  # correction steps: large chains fall out of cache and run slower per layer
        model = Model(kind, max(1, round(4 * target_ms / ms)))
        for _ in range(3):
            s = model.open(directory)
            time_runs(lambda: s.run(f), 20)
            again = min(statistics.median(time_runs(lambda: s.run(f), 50)) for _ in range(3)) * 1000
            model = Model(kind, max(1, round(model.size * target_ms / again)))
    log(f"calibrate: {probe} -> {ms:.3f} ms; using {model} for ~{target_ms} ms")
    return model


# ---- (1) in-process --------------------------------------------------------------------------------
def paired(raw_once, other_once, pairs: int, seed: int = 0) -> dict:
    """Time raw and other back to back, in random order, `pairs` times. The median of per-pair differences
    is robust to load drift on a shared machine and to order effects (caches warmed by the previous call)."""
    rng = random.Random(seed)
    raws, diffs = [], []
    for _ in range(pairs):
        if rng.random() < 0.5:
            r, o = raw_once(), other_once()
        else:
            o, r = other_once(), raw_once()
        raws.append(r)
        diffs.append(o - r)
    raw, diff = statistics.median(raws), statistics.median(diffs)
    return {
        "raw_ms": raw * 1e3,
        "served_ms": (raw + diff) * 1e3,
        "overhead_us": diff * 1e6,
        "ratio": (raw + diff) / raw,
    }


def _timed(fn) -> Callable[[], float]:
    def once() -> float:
        t = time.perf_counter()
        fn()
        return time.perf_counter() - t

    return once


def bench_inprocess(directory: Path, model: Model, pairs: int = 2000) -> dict:
    session = model.open(directory)
    reg = ModelRegistry()
    reg.activate("m", "1", session)
    f = model.feeds()
    raw = raw_run(session, f)
    time_runs(raw, 50)
    time_runs(lambda: reg.infer("m", f), FINITE_FIRST + 50)  # past the first responses, which are all checked
    result = paired(_timed(raw), _timed(lambda: reg.infer("m", f)), pairs)
    stats = reg.model_stats("m", "1")
    stats.watch(True)  # as on probation: every response checked for NaN/Inf
    watched = paired(_timed(raw), _timed(lambda: reg.infer("m", f)), pairs)
    stats.watch(False)
    reg.close()
    return {**result, "probation_ratio": watched["ratio"], "probation_overhead_us": watched["overhead_us"]}


# ---- HTTP clients (in a child process) -----------------------------------------------------------
def _request(model: Model) -> tuple[bytes, dict]:
    x = model.feeds()["input"]
    head = json.dumps(
        {
            "inputs": [
                {
                    "name": "input",
                    "shape": list(x.shape),
                    "datatype": "FP32",
                    "parameters": {"binary_data_size": x.nbytes},
                }
            ],
            "outputs": [{"name": "probabilities", "parameters": {"binary_data": True}}],
        }
    ).encode()
    return head + x.tobytes(), {
        "Inference-Header-Content-Length": str(len(head)),
        "Content-Type": "application/octet-stream",
    }


class _LeanClient:
    """One keep-alive HTTP/1.1 connection: the request goes out in one sendmsg (head + tensor bytes, no copy),
    the response is framed by Content-Length and its status checked; no other parsing."""

    def __init__(self, port: int, model: Model):
        self.port = port
        body, headers = _request(model)
        head = "".join(f"{k}: {v}\r\n" for k, v in headers.items())
        self.parts = [
            f"POST /v2/models/m/infer HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Length: {len(body)}\r\n"
            f"{head}\r\n".encode(),
            body,
        ]
        self.buf = bytearray(1 << 20)
        self.sock = self._connect()

    def _connect(self):
        import socket

        sock = socket.create_connection(("127.0.0.1", self.port), timeout=60)
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _response(self) -> bool:
        view, got = memoryview(self.buf), 0
        while True:
            k = self.sock.recv_into(view[got:])
            if not k:
                raise ConnectionError("server closed the connection")
            got += k
            end = self.buf.find(b"\r\n\r\n", 0, got)
            if end >= 0:
                break
        head = bytes(self.buf[:end]).lower()
        at = head.index(b"content-length:") + 15
        length = int(head[at : head.index(b"\r\n", at) if b"\r\n" in head[at:] else len(head)])
        need = end + 4 + length
        if need > len(self.buf):
            self.buf.extend(bytes(need - len(self.buf)))
            view = memoryview(self.buf)
        while got < need:
            k = self.sock.recv_into(view[got:need])
            if not k:
                raise ConnectionError("server closed the connection")
            got += k
        return head.startswith(b"http/1.1 200")

    def one(self) -> tuple[float, float, bool]:
        t0, p0 = time.time(), time.perf_counter()
        try:
            self.sock.sendmsg(self.parts)  # well under the socket buffer: sent whole
            ok = self._response()
        except Exception:  # noqa: BLE001 - counted as a failed request
            ok = False
            self.sock.close()
            self.sock = self._connect()
        return t0, time.perf_counter() - p0, ok


class _Client:
    """One keep-alive connection through Python's http.client, sending the model's binary request."""

    def __init__(self, port: int, model: Model):
        self.port = port
        self.body, self.headers = _request(model)
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=60)

    def one(self) -> tuple[float, float, bool]:
        t0, p0 = time.time(), time.perf_counter()
        try:
            self.conn.request("POST", "/v2/models/m/infer", body=self.body, headers=self.headers)
            r = self.conn.getresponse()
            r.read()
            ok = r.status == 200
        except Exception:  # noqa: BLE001 - counted as a failed request
            ok = False
            self.conn.close()
            self.conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=60)
        return t0, time.perf_counter() - p0, ok


CLIENTS = {"lean": _LeanClient, "http.client": _Client}


def _serial_client(port: int, kind: str, size: int, pipe, client_kind: str = "lean") -> None:
    """Sends one request per command and replies with its latency (the pipe itself is not timed)."""
    client = CLIENTS[client_kind](port, Model(kind, size))
    while pipe.recv():
        pipe.send(client.one()[1])


def _load_clients(port: int, kind: str, size: int, threads: int, stop, out, client_kind: str = "lean") -> None:
    def loop():
        client, samples = CLIENTS[client_kind](port, Model(kind, size)), []
        while not stop.is_set():
            samples.append(client.one())
        out.put(samples)

    ts = [threading.Thread(target=loop) for _ in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join()


# ---- (2) HTTP vs raw -------------------------------------------------------------------------------
def bench_http(directory: Path, model: Model, pairs: int = 1500) -> dict:
    session = model.open(directory)
    reg = ModelRegistry()
    reg.activate("m", "1", session)
    srv = OIPServer(reg, port=0).start()
    f = model.feeds()
    raw = raw_run(session, f)
    ctx = mp.get_context("spawn")
    out = {"model": str(model), "input_bytes": f["input"].nbytes}
    for client_kind in ("lean", "http.client"):
        here, there = ctx.Pipe()
        p = ctx.Process(target=_serial_client, args=(srv.port, model.kind, model.size, there, client_kind))
        p.start()

        def http_once() -> float:
            here.send(True)
            return here.recv()

        for _ in range(FINITE_FIRST + 100 if client_kind == "lean" else 100):  # warm-up, past the first responses
            http_once()
        time_runs(raw, 50)
        result = paired(_timed(raw), http_once, pairs if client_kind == "lean" else pairs // 2)
        here.send(False)
        p.join(60)
        if client_kind == "lean":
            out.update(result)
        else:
            out["http_client"] = result
    srv.shutdown(10)
    reg.close()
    return out


# ---- (3) swaps under load ------------------------------------------------------------------------
def rss_mb() -> float:
    import psutil

    return psutil.Process().memory_info().rss / 2**20


def _build(model: Model, directory: Path, seed: int, nice: int):
    """Open and warm a session as the daemon does: in a thread `nice` levels below serving (run_lowered)."""

    def work():
        session = model.open(directory, seed=seed)
        session.run(model.feeds())
        return session

    return run_lowered(work, nice)[0]


def bench_swaps(
    directory: Path,
    model: Model,
    swaps: int,
    clients: int,
    rounds: int = 10,
    quiet_s: float = 0.5,
    nice: int = 0,
    rss_window_s: float = 2.0,
) -> dict:
    """Swap 1, then `rounds` x (quiet_s without swaps, a batch of swaps), then a last quiet window: steady and
    swap windows interleave in time. RSS is read at the end of the quiet window after swap 1 and after the last
    swap, both with the serving session warmed by the same load."""
    reg = ModelRegistry(drain_timeout=60)
    reg.activate("m", "0", model.open(directory, seed=0))
    srv = OIPServer(reg, port=0).start()
    model.open(directory, seed=1).close()  # the two model files swapped back and forth
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_load_clients, args=(srv.port, model.kind, model.size, clients, stop, q))
    p.start()
    time.sleep(2.0)  # clients connect and warm up (excluded from both windows)
    steady, swapping, rss, results = [], [], {}, []
    batches = [[1]] + [list(b) for b in np.array_split(np.arange(2, swaps + 1), rounds) if len(b)]
    for batch in batches + [[]]:
        t = time.time()
        measure = len(results) in (1, swaps)
        time.sleep(max(quiet_s, rss_window_s) if measure else quiet_s)  # same load time before both RSS reads
        steady.append((t, time.time()))
        if measure:
            rss[len(results)] = rss_mb()
        t = time.time()
        for i in batch:
            session = _build(model, directory, int(i) % 2, nice)  # make (and warm) ...
            results.append(reg.activate("m", str(i), session))  # ... then break
        if batch:
            swapping.append((t, time.time()))
    stop.set()
    samples = [s for _ in range(clients) for s in q.get(timeout=600)]
    p.join(60)
    srv.shutdown(10)
    reg.close()

    def within(windows):
        return [lat for t, lat, ok in samples if ok and any(a <= t < b for a, b in windows)]

    calm, busy = within(steady), within(swapping)
    return {
        "model": str(model),
        "swaps": len(results),
        "build_nice": nice,
        "requests": len(samples),
        "failed": sum(1 for *_, ok in samples if not ok),
        "steady_requests": len(calm),
        "swap_requests": len(busy),
        "steady_p99_ms": pct(calm, 99) * 1e3,
        "swap_p99_ms": pct(busy, 99) * 1e3,
        "p99_ratio": pct(busy, 99) / pct(calm, 99),
        "swap_s": sum(b - a for a, b in swapping),
        "rss_after_1_mb": rss[1],
        "rss_after_n_mb": rss[swaps],
        "rss_ratio": rss[swaps] / rss[1],
        "undrained": sum(1 for r in results if not r["drained"]),
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--swaps", type=int, default=100)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--target-ms", type=float, default=1.0)
    ap.add_argument("--quiet-s", type=float, default=0.5, help="steady window before each round of swaps")
    ap.add_argument("--swap-model", choices=["cnn", "matmul"], default="cnn")
    ap.add_argument(
        "--build-nice",
        type=int,
        default=10,
        help="build new sessions this many nice levels below serving, as the daemon does (serving."
        "build_nice, default 10; 0: at serving priority)",
    )
    ap.add_argument(
        "--malloc-arenas",
        type=int,
        default=2,
        help="glibc arena cap, with the daemon's fixed mmap threshold (0: leave glibc's defaults)",
    )
    ap.add_argument("--parts", default="1,2,3", help="which of the three benchmarks to run (default: all)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    if args.malloc_arenas:  # what the daemon does at start, before serving threads exist
        limit_malloc_arenas(args.malloc_arenas)
        fix_mmap_threshold(MMAP_THRESHOLD)
    with tempfile.TemporaryDirectory(prefix="bench-serving-") as tmp:
        d = Path(tmp)
        models = {k: calibrate(d, k, args.target_ms) for k in ("cnn", "matmul")}
        report = {"cpus": os.cpu_count(), "malloc_arenas": args.malloc_arenas or "default", "inprocess": {}, "http": {}}
        parts = {p.strip() for p in args.parts.split(",")}
        for kind, model in models.items():
            if "1" in parts:
                log(f"(1) in-process registry.infer vs session.run: {model} ...")
                report["inprocess"][kind] = bench_inprocess(d, model)
            if "2" in parts:
                log(f"(2) HTTP binary vs session.run: {model} ...")
                report["http"][kind] = bench_http(d, model)
        if "3" in parts:
            log(f"(3) {args.swaps} swaps under {args.clients} clients: {models[args.swap_model]} ...")
            report["swaps"] = bench_swaps(
                d, models[args.swap_model], args.swaps, args.clients, quiet_s=args.quiet_s, nice=args.build_nice
            )
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(
        f"{report['cpus']} CPUs, malloc arenas {report['malloc_arenas']}, build nice {args.build_nice}; models sized to ~{args.target_ms} ms: "
        + ", ".join(map(str, models.values()))
    )
    for kind, a in report["inprocess"].items():
        print(
            f"(1) in-process {kind}: raw {a['raw_ms']:.3f} ms, registry {a['served_ms']:.3f} ms -> "
            f"{a['ratio']:.3f}x (+{a['overhead_us']:.1f} us; goal <= 1.03x); on probation (every response "
            f"checked for NaN/Inf) {a['probation_ratio']:.3f}x (+{a['probation_overhead_us']:.1f} us)"
        )
    for kind, h in report["http"].items():
        c = h["http_client"]
        print(
            f"(2) HTTP binary {kind} ({h['input_bytes'] // 1024} KB in): raw {h['raw_ms']:.3f} ms, "
            f"HTTP {h['served_ms']:.3f} ms -> {h['ratio']:.3f}x (+{h['overhead_us']:.0f} us; goal <= 1.5x); "
            f"through http.client {c['ratio']:.3f}x (+{c['overhead_us']:.0f} us)"
        )
    s = report.get("swaps")
    if s is None:
        return 0
    print(
        f"(3) {s['swaps']} swaps in {s['swap_s']:.1f} s, {args.clients} clients, {s['model']}: {s['requests']} requests, "
        f"{s['failed']} failed (goal 0); p99 steady {s['steady_p99_ms']:.2f} ms, during swaps {s['swap_p99_ms']:.2f} ms "
        f"-> {s['p99_ratio']:.2f} (goal <= 1.5); RSS {s['rss_after_1_mb']:.1f} -> {s['rss_after_n_mb']:.1f} MB -> "
        f"{s['rss_ratio']:.3f} (goal <= 1.05)"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
