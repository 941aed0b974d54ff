"""JSON against binary inference over HTTP, same run, same server (not run by the tests; issue 41).

  (1) throughput at --clients client processes, JSON / binary, for an image classifier (squeezenet, FP32
      [1,3,224,224] in: a 3.1 MB JSON body as tritonclient.http writes it with binary_data=False) goal >= 0.3x,
      for the same input through a pooling layer (no compute: the transport alone, no goal)
      and for a small model (FP32 [1,16] in and out)                                             goal >= 0.7x
  (2) the server's peak RSS per JSON image request in flight (1 and --clients at once): VmHWM after the requests
      minus VmRSS before them (the peak is reset through /proc/<pid>/clear_refs), divided by the requests

Usage: .venv/bin/python bench/bench_json.py [--clients 8] [--seconds 3] [--rounds 2] [--models img,pool,small] [--json]
The server (OIPServer with the daemon's defaults: 64 MiB body limit, 256 MiB request memory budget, 2 malloc
arenas, fixed mmap threshold) lives in its own process; every client process sends one pre-encoded request over
and over on a keep-alive connection (so the figures are the server's cost, not the client's JSON encoder), and
counts the answers by status: a 503 (budget full) is counted, never retried. Each round runs the four phases in
random order; the figures are medians over rounds, ratios within the same run. About 80 s with the defaults.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import socket
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

IMAGE = [1, 3, 224, 224]
SMALL = [1, 16]
# model -> (input, output, input shape): squeezenet (onnx's light_squeezenet, ~20 ms a run on one thread here),
# the same image through a pooling layer (no compute: the transport alone), and a [1,16] Relu
GOALS = {"img": 0.3, "small": 0.7}  # JSON / binary throughput (issue 41)
MODELS = {"img": ("data_0", "softmaxout_1", IMAGE), "pool": ("x", "y", IMAGE), "small": ("x", "y", SMALL)}


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def _models(d: Path) -> dict[str, str]:
    from onnx import TensorProto, helper, save

    from agent.conformance.models import light_dir

    vi = helper.make_tensor_value_info
    graphs = {
        "pool": ([helper.make_node("GlobalAveragePool", ["x"], ["y"])], IMAGE, [1, 3, 1, 1]),
        "small": ([helper.make_node("Relu", ["x"], ["y"])], SMALL, SMALL),
    }
    paths = {"img": str(light_dir() / "light_squeezenet.onnx")}
    for name, (nodes, shape_in, shape_out) in graphs.items():
        g = helper.make_graph(
            nodes, name, [vi("x", TensorProto.FLOAT, shape_in)], [vi("y", TensorProto.FLOAT, shape_out)]
        )
        paths[name] = str(d / f"{name}.onnx")
        save(helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)]), paths[name])
    return paths


def _serve(paths: dict[str, str], ports, stop) -> None:
    from agent.providers import get
    from agent.serving.http.server import OIPServer
    from agent.serving.memory import fix_mmap_threshold, limit_malloc_arenas
    from agent.serving.registry import ModelRegistry

    limit_malloc_arenas(2)  # as the daemon does
    fix_mmap_threshold()
    reg = ModelRegistry()
    for name, path in paths.items():
        reg.activate(name, "1", get("cpu").open_session(path, options={"intra_op_num_threads": 1}))
    srv = OIPServer(reg, port=0).start()
    ports.put((srv.port, os.getpid()))
    stop.wait()
    srv.shutdown(5)
    reg.close()


def requests(model: str) -> dict[str, tuple[bytes, bytes]]:
    """(HTTP head, body) for the binary and the JSON form of the model's input (JSON as tritonclient writes it:
    flat data of Python floats, outputs asked for in the request's own form)."""
    name, out, shape = MODELS[model]
    x = np.random.default_rng(0).random(shape, dtype=np.float32)
    doc = {
        "inputs": [{"name": name, "shape": shape, "datatype": "FP32", "data": [v.item() for v in x.reshape(-1)]}],
        "outputs": [{"name": out, "parameters": {"binary_data": False}}],
    }
    as_json = json.dumps(doc).encode()
    head = json.dumps(
        {
            "inputs": [
                {"name": name, "shape": shape, "datatype": "FP32", "parameters": {"binary_data_size": x.nbytes}}
            ],
            "outputs": [{"name": out, "parameters": {"binary_data": True}}],
        }
    ).encode()
    as_binary = head + x.tobytes()
    line = f"POST /v2/models/{model}/infer HTTP/1.1\r\nHost: b\r\n"
    return {
        "binary": (
            (
                line + f"Content-Length: {len(as_binary)}\r\nInference-Header-Content-Length: {len(head)}\r\n\r\n"
            ).encode(),
            as_binary,
        ),
        "json": (
            (line + f"Content-Length: {len(as_json)}\r\nContent-Type: application/json\r\n\r\n").encode(),
            as_json,
        ),
    }


class Conn:
    """One keep-alive connection: send a request, read the status and the Content-Length framed answer."""

    def __init__(self, port: int):
        self.port = port
        self.sock = self._open()
        self.buf = bytearray(1 << 20)

    def _open(self) -> socket.socket:
        s = socket.create_connection(("127.0.0.1", self.port))
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return s

    def post(self, head: bytes, body: bytes) -> int:
        self.sock.sendmsg([head, body])
        view, got = memoryview(self.buf), 0
        while (end := self.buf.find(b"\r\n\r\n", 0, got)) < 0:
            n = self.sock.recv_into(view[got:])
            if not n:
                raise ConnectionError("closed")
            got += n
        headers = bytes(self.buf[:end]).decode("latin-1").lower()
        status = int(headers.split(" ", 2)[1])
        length = int(headers.split("content-length:")[1].split("\r\n")[0])
        while got < end + 4 + length:
            got += self.sock.recv_into(view[got:])
        if "connection: close" in headers:
            self.sock.close()
            self.sock = self._open()
        return status


def _client(port: int, model: str, form: str, seconds: float, start, out) -> None:
    head, body = requests(model)[form]
    conn = Conn(port)
    counts: dict[int, int] = {}
    start.wait()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        status = conn.post(head, body)
        counts[status] = counts.get(status, 0) + 1
    out.put(counts)


def throughput(port: int, model: str, form: str, clients: int, seconds: float) -> tuple[float, dict]:
    ctx = mp.get_context("fork")
    start, out = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client, args=(port, model, form, seconds, start, out)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(0.5)  # every client has built its request
    start.set()
    statuses: dict[int, int] = {}
    for _ in procs:
        for k, v in out.get(timeout=seconds + 120).items():
            statuses[k] = statuses.get(k, 0) + v
    for p in procs:
        p.join(30)
    return statuses.get(200, 0) / seconds, statuses


def _status(pid: int, key: str) -> int:
    with open(f"/proc/{pid}/status") as fh:
        for line in fh:
            if line.startswith(key + ":"):
                return int(line.split()[1]) * 1024
    raise RuntimeError(f"no {key}")


def peak_per_request(port: int, pid: int, k: int) -> tuple[float, list[int]]:
    """(MiB of server peak RSS per JSON image request, statuses) with k such requests sent at once."""
    head, body = requests("img")["json"]
    conns = [Conn(port) for _ in range(k)]
    with open(f"/proc/{pid}/clear_refs", "w") as fh:
        fh.write("5")  # VmHWM := VmRSS
    base = _status(pid, "VmRSS")
    statuses: list[int] = []
    threads = [threading.Thread(target=lambda c=c: statuses.append(c.post(head, body))) for c in conns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    return (_status(pid, "VmHWM") - base) / k / (1 << 20), sorted(statuses)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=3.0)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--models", default="img,pool,small", help="which of img, pool, small (comma-separated)")
    ap.add_argument("--json", action="store_true", help="print the result as JSON")
    args = ap.parse_args()
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    paths = _models(Path(tempfile.mkdtemp(prefix="bench-json-")))
    server = ctx.Process(target=_serve, args=(paths, ports, stop), daemon=True)
    server.start()
    try:
        port, pid = ports.get(timeout=120)
    except Exception:
        stop.set()
        raise
    models = [m for m in args.models.split(",") if m]
    phases = [(s, f) for s in models for f in ("binary", "json")]
    rates: dict[str, list[float]] = {f"{s}_{f}": [] for s, f in phases}
    refused: dict[str, int] = {k: 0 for k in rates}
    try:
        for r in range(args.rounds):
            random.shuffle(phases)
            for s, f in phases:
                rate, statuses = throughput(port, s, f, args.clients, args.seconds)
                rates[f"{s}_{f}"].append(rate)
                refused[f"{s}_{f}"] += sum(v for k, v in statuses.items() if k != 200)
                log(f"round {r + 1}: {s} {f}: {rate:.1f} req/s {statuses}")
        peaks = {k: peak_per_request(port, pid, k) for k in (1, args.clients)} if "img" in models else {}
    finally:
        stop.set()
        server.join(30)
    med = {k: statistics.median(v) for k, v in rates.items()}
    ratio = {s: round(med[f"{s}_json"] / med[f"{s}_binary"], 3) if med[f"{s}_binary"] else 0.0 for s in models}
    result = {
        "clients": args.clients,
        "seconds": args.seconds,
        "rounds": args.rounds,
        "req_per_s": {k: round(v, 1) for k, v in med.items()},
        "refused": refused,
        "json_over_binary": ratio,
        "peak_rss_mib_per_json_request": {str(k): round(v[0], 1) for k, v in peaks.items()},
        "peak_statuses": {str(k): v[1] for k, v in peaks.items()},
        "goals": {f"{m} >= {GOALS[m]}": ratio[m] >= GOALS[m] for m in models if m in GOALS},
        "cpus": os.cpu_count(),
        "load_average": round(os.getloadavg()[0], 1),
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"throughput at {args.clients} clients (medians of {args.rounds} rounds of {args.seconds:g} s):")
    for s in models:
        print(
            f"  {s} FP32 {MODELS[s][2]}: binary {med[f'{s}_binary']:.1f} req/s, JSON {med[f'{s}_json']:.1f} req/s, "
            f"JSON/binary {ratio[s]:.2f}x (refused: binary {refused[f'{s}_binary']}, JSON {refused[f'{s}_json']})"
        )
    for k, (mib, statuses) in peaks.items():
        print(f"  server peak RSS per JSON image request, {k} in flight: {mib:.1f} MiB (statuses {statuses})")
    print(f"goals: {result['goals']}; {os.cpu_count()} CPUs, load average {result['load_average']}")


if __name__ == "__main__":
    main()
