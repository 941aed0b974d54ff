"""Transport benchmark, same run, same model (not run by the tests): KServe v2 gRPC (binary, raw contents) and the
system shared memory path against HTTP binary and against a plain InferenceSession.run.

  (1) per request, 1 MiB FP32 in and out: HTTP binary, gRPC binary, gRPC + shared memory, HTTP + shared memory,
      session.run in the client's process;       goal: shared memory >= 2x faster than HTTP binary
  (2) throughput at --clients client processes: gRPC binary / HTTP binary      goal >= 1.0
      and grpcio's own floor beside it: a bare grpcio echo server, no model (grpc_floor.py)
      with the server process's CPU time per request in that phase (from /proc/<pid>/stat: user + system), the
      figure a busy machine disturbs least, and the client processes' own CPU time per request

Usage: .venv/bin/python bench/bench_protocols.py [--mib 1] [--rounds 200] [--clients 8] [--seconds 5] [--json]
       [--tritonclient]
The server (OIPServer + GRPCServer over one DataPlane, as the daemon runs them) lives in its own process; every
client is lean (one sendmsg per HTTP request with Content-Length framing; gRPC through grpcio with bytes in and
out, the response parsed with protobuf), so the figures are the server's and the transport's cost. Each round
times every path once, in random order; medians over rounds. The model is Relu over [1, N] FP32 (N = mib x 2^18):
its compute is small, so the transport dominates. The `*_shm` paths include writing the input into the region
and copying the output out of it (a client that keeps its frames elsewhere); the `*_shm_in_place` paths do
neither: the producer wrote the frame into the region and the consumer reads the result there (a camera or audio
pipeline built around the region). --tritonclient adds the HTTP binary and in-place shm requests made through
unmodified tritonclient.http, beside the lean client's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import random
import statistics
import sys
import tempfile
import time
from multiprocessing import shared_memory
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
from grpc_floor import serve_echo  # noqa: E402
from protocol_clients import GrpcClient, HttpClient  # noqa: E402


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def relu_model(n: int):
    from onnx import TensorProto, helper

    g = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "relu",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, n])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, n])],
    )
    return helper.make_model(g, opset_imports=[helper.make_opsetid("", 17)])


def _session(path: str):
    import onnxruntime as ort

    so = ort.SessionOptions()
    so.intra_op_num_threads = 1
    return ort.InferenceSession(path, so, providers=["CPUExecutionProvider"])


def _serve(path: str, ports, stop) -> None:
    from agent.serving.grpc.front import GRPCServer
    from agent.serving.http.server import OIPServer
    from agent.serving.memory import fix_mmap_threshold, limit_malloc_arenas
    from agent.serving.registry import ModelRegistry

    limit_malloc_arenas(2)
    fix_mmap_threshold()
    reg = ModelRegistry()
    from agent.providers import get

    reg.activate("relu", "1", get("cpu").open_session(path, options={"intra_op_num_threads": 1}))
    http = OIPServer(reg, port=0).start()
    grpc_srv = GRPCServer(http.plane, port=0).start()
    ports.put((http.port, grpc_srv.port))
    stop.wait()
    grpc_srv.shutdown(2)
    http.shutdown(2)


class Shm:
    """The client's two regions, registered with the server (over gRPC; the regions serve HTTP requests too)."""

    def __init__(self, grpc_client: GrpcClient, n: int, tag: str):
        self.n = n
        self.regions = []
        for role in ("in", "out"):
            name = f"ea_bench_{tag}_{role}"
            try:
                shared_memory.SharedMemory(name).unlink()
            except FileNotFoundError:
                pass
            self.regions.append(shared_memory.SharedMemory(name, create=True, size=4 * n))
        self.x = np.ndarray((1, n), np.float32, self.regions[0].buf)
        self.y = np.ndarray((1, n), np.float32, self.regions[1].buf)
        import grpc

        pb = grpc_client.pb
        for role, region in zip(("in", "out"), self.regions):
            reg = pb.SystemSharedMemoryRegisterRequest(name=role, key="/" + region.name, offset=0, byte_size=4 * n)
            grpc_client.channel.unary_unary("/inference.GRPCInferenceService/SystemSharedMemoryRegister")(
                reg.SerializeToString()
            )
        self.grpc_body = grpc_client.shm_request()
        self.http_body = json.dumps(
            {
                "inputs": [
                    {
                        "name": "x",
                        "shape": [1, n],
                        "datatype": "FP32",
                        "parameters": {"shared_memory_region": "in", "shared_memory_byte_size": 4 * n},
                    }
                ],
                "outputs": [
                    {"name": "y", "parameters": {"shared_memory_region": "out", "shared_memory_byte_size": 4 * n}}
                ],
            }
        ).encode()
        del grpc

    def close(self) -> None:
        del self.x, self.y
        for r in self.regions:
            r.close()
            r.unlink()


def _tritonclient_paths(http_port: int, x: np.ndarray, shm: Shm) -> dict:
    """The same requests through unmodified tritonclient.http: binary tensors, and the bench's regions (in place)."""
    import tritonclient.http as th

    c = th.InferenceServerClient(f"127.0.0.1:{http_port}")

    def tc_binary():
        i = th.InferInput("x", list(x.shape), "FP32")
        i.set_data_from_numpy(x, binary_data=True)
        return c.infer("relu", [i], outputs=[th.InferRequestedOutput("y", binary_data=True)]).as_numpy("y")

    def tc_shm_in_place():
        i = th.InferInput("x", list(x.shape), "FP32")
        i.set_shared_memory("in", x.nbytes)
        o = th.InferRequestedOutput("y")
        o.set_shared_memory("out", x.nbytes)
        c.infer("relu", [i], outputs=[o])
        return shm.y

    return {"tritonclient_http_binary": tc_binary, "tritonclient_http_shm_in_place": tc_shm_in_place}


def per_request(http_port: int, grpc_port: int, path: str, n: int, rounds: int, tritonclient: bool = False) -> dict:
    sess = _session(path)
    x = np.random.default_rng(0).standard_normal((1, n)).astype(np.float32)
    want = np.maximum(x, 0)
    h, g = HttpClient(http_port, n), GrpcClient(grpc_port, n)
    shm = Shm(g, n, str(os.getpid()))

    def run_plain():
        return sess.run(None, {"x": x})[0]

    def run_http():
        return h.infer(x)

    def run_grpc():
        return g.infer(x)

    def run_grpc_shm():
        shm.x[:] = x
        g.call(shm.grpc_body)
        return np.array(shm.y)

    def run_http_shm():
        shm.x[:] = x
        h.infer_json(shm.http_body)
        return np.array(shm.y)

    def run_grpc_shm_in_place():  # the producer wrote the frame into the region; the consumer reads it there
        g.call(shm.grpc_body)
        return shm.y

    def run_http_shm_in_place():
        h.infer_json(shm.http_body)
        return shm.y

    paths = {
        "session_run": run_plain,
        "http_binary": run_http,
        "grpc_binary": run_grpc,
        "grpc_shm": run_grpc_shm,
        "http_shm": run_http_shm,
        "grpc_shm_in_place": run_grpc_shm_in_place,
        "http_shm_in_place": run_http_shm_in_place,
    }
    if tritonclient:
        paths.update(_tritonclient_paths(http_port, x, shm))
    for f in paths.values():  # warm up and check every path answers right
        for _ in range(5):
            out = f()
        assert np.array_equal(np.asarray(out).reshape(1, n), want), "wrong answer"
    times: dict[str, list[float]] = {k: [] for k in paths}
    order = list(paths)
    for _ in range(rounds):
        random.shuffle(order)
        for k in order:
            t0 = time.perf_counter()
            paths[k]()
            times[k].append(time.perf_counter() - t0)
    shm.close()
    return {k: statistics.median(v) for k, v in times.items()}


def _client_loop(kind: str, port: int, n: int, seconds: float, start, counts) -> None:
    x = np.random.default_rng(1).standard_normal((1, n)).astype(np.float32)
    from grpc_floor import EchoClient

    c = {"http": HttpClient, "grpc": GrpcClient, "grpc_floor": EchoClient}[kind](port, n)
    c.infer(x)
    start.wait()
    done, end, cpu0 = 0, time.perf_counter() + seconds, time.process_time()
    while time.perf_counter() < end:
        c.infer(x)
        done += 1
    counts.put((done, time.process_time() - cpu0))  # this client process's CPU (grpcio's own threads included)


def _cpu_s(pid: int) -> float:
    """User + system CPU seconds of a process so far (/proc/<pid>/stat, clock ticks)."""
    with open(f"/proc/{pid}/stat") as fh:
        fields = fh.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def throughput(
    kind: str, port: int, n: int, clients: int, seconds: float, server_pid: int
) -> tuple[float, float, float]:
    """(requests per second, server CPU ms per request, clients' CPU ms per request) with `clients` processes for
    `seconds`: on a host whose cores the clients share with the server, the two CPU figures bound the rate."""
    ctx = mp.get_context("spawn")
    start, counts = ctx.Event(), ctx.Queue()
    procs = [ctx.Process(target=_client_loop, args=(kind, port, n, seconds, start, counts)) for _ in range(clients)]
    for p in procs:
        p.start()
    time.sleep(2.0)  # clients connected and warmed
    cpu0 = _cpu_s(server_pid)
    start.set()
    got = [counts.get(timeout=seconds + 120) for _ in procs]
    cpu1 = _cpu_s(server_pid)
    for p in procs:
        p.join(30)
    total = sum(done for done, _ in got)
    return total / seconds, (cpu1 - cpu0) * 1e3 / max(total, 1), sum(c for _, c in got) * 1e3 / max(total, 1)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--mib", type=float, default=1.0)
    ap.add_argument("--rounds", type=int, default=200)
    ap.add_argument("--clients", type=int, default=8)
    ap.add_argument("--seconds", type=float, default=5.0)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--tritonclient", action="store_true", help="also time the HTTP paths through tritonclient.http")
    args = ap.parse_args()
    n = int(args.mib * (1 << 18))
    import onnx

    path = os.path.join(tempfile.mkdtemp(prefix="bench-proto-"), "relu.onnx")
    onnx.save(relu_model(n), path)
    ctx = mp.get_context("spawn")
    ports, stop = ctx.Queue(), ctx.Event()
    server = ctx.Process(target=_serve, args=(path, ports, stop), daemon=True)
    server.start()
    http_port, grpc_port = ports.get(timeout=120)
    floor = ctx.Process(target=serve_echo, args=(ports, stop), daemon=True)  # grpcio alone: no model, no our code
    floor.start()
    floor_port = ports.get(timeout=120)
    try:
        log(f"per request, {args.mib:g} MiB in and out, {args.rounds} rounds (medians) ...")
        med = per_request(http_port, grpc_port, path, n, args.rounds, args.tritonclient)
        log(f"throughput at {args.clients} clients, {args.seconds:g} s each ...")
        measured = {
            k: throughput(k, p, n, args.clients, args.seconds, pid)
            for k, p, pid in (
                ("http", http_port, server.pid),
                ("grpc", grpc_port, server.pid),
                ("grpc_floor", floor_port, floor.pid),
            )
        }
        tput = {k: v[0] for k, v in measured.items()}
        cpu = {k: v[1] for k, v in measured.items()}
        client_cpu = {k: v[2] for k, v in measured.items()}
    finally:
        stop.set()
        server.join(10)
        floor.join(10)
    result = {
        "input_mib": args.mib,
        "cpus": os.cpu_count(),
        "median_ms": {k: round(v * 1e3, 3) for k, v in med.items()},
        "ratio_vs_session_run": {k: round(v / med["session_run"], 2) for k, v in med.items()},
        "speedup_vs_http_binary": {k: round(med["http_binary"] / v, 2) for k, v in med.items()},
        "throughput_rps": {k: round(v, 1) for k, v in tput.items()},
        "grpc_over_http_throughput": round(tput["grpc"] / tput["http"], 2),
        "grpc_floor_over_http_throughput": round(tput["grpc_floor"] / tput["http"], 2),
        "server_cpu_ms_per_request": {k: round(v, 3) for k, v in cpu.items()},
        "client_cpu_ms_per_request": {k: round(v, 3) for k, v in client_cpu.items()},
        "goals": {
            "shm_2x_faster_than_http_binary (grpc_shm, http_shm, grpc_shm_in_place, http_shm_in_place)": [
                med["http_binary"] / med[k] >= 2.0
                for k in ("grpc_shm", "http_shm", "grpc_shm_in_place", "http_shm_in_place")
            ],
            "grpc_throughput_at_least_http": tput["grpc"] >= tput["http"],
        },
    }
    if args.json:
        print(json.dumps(result, indent=2))
        return
    print(f"per request ({args.mib:g} MiB FP32 in and out; medians of {args.rounds} rounds; {os.cpu_count()} CPUs):")
    for k, v in med.items():
        print(
            f"  {k:31s} {v * 1e3:8.3f} ms   x{v / med['session_run']:.2f} of session.run   "
            f"{med['http_binary'] / v:.2f}x as fast as HTTP binary"
        )
    print(f"throughput at {args.clients} clients: " + ", ".join(f"{k} {v:.1f} req/s" for k, v in tput.items()))
    print(
        f"  gRPC / HTTP binary: {tput['grpc'] / tput['http']:.2f}; grpcio's own echo / HTTP binary (its floor): "
        f"{tput['grpc_floor'] / tput['http']:.2f}"
    )
    print("  server CPU per request: " + ", ".join(f"{k} {v:.3f} ms" for k, v in cpu.items()))
    print("  clients' CPU per request: " + ", ".join(f"{k} {v:.3f} ms" for k, v in client_cpu.items()))
    print(f"goals: {result['goals']}; load average {os.getloadavg()[0]:.1f}")


if __name__ == "__main__":
    main()
