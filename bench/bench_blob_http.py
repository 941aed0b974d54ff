"""`fleet serve --http` beside an idle crowd: the latency of a real 64 KiB chunk request with 1,000 idle
connections held open, against the same request with none (both measured in this run, same server).

    .venv/bin/python bench/bench_blob_http.py [--idle 1000] [--requests 50] [--json]
    .venv/bin/python bench/bench_blob_http.py --cli [--nofile 1024]   # the real `edge-agent fleet serve --http`
--cli runs the CLI as a subprocess (with a real Mosquitto broker, RLIMIT_NOFILE --nofile as in issue 29) instead of
the BlobServer in this process, and adds the server's thread and descriptor counts beside the crowd.
Not run by the test suite. Prints the median and the slowest of each, and their ratio.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import socket
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _chunk(port: int, sha: str) -> float:
    t = time.perf_counter()
    with socket.create_connection(("127.0.0.1", port), timeout=30) as s:
        s.sendall(f"GET /blobs/sha256/{sha} HTTP/1.1\r\nRange: bytes=0-65535\r\nConnection: close\r\n\r\n".encode())
        n = 0
        while chunk := s.recv(1 << 16):
            n += len(chunk)
    assert n > 65536
    return time.perf_counter() - t


def _series(port: int, sha: str, n: int) -> list[float]:
    return [_chunk(port, sha) for _ in range(n)]


def _proc_count(pid: int) -> dict:
    with open(f"/proc/{pid}/status") as fh:
        threads = next(int(ln.split()[1]) for ln in fh if ln.startswith("Threads:"))
    return {"server_threads": threads, "server_fds": len(os.listdir(f"/proc/{pid}/fd"))}


def _cli(args: argparse.Namespace, tmp: Path) -> dict:
    """The same series against `edge-agent fleet serve --http` in a subprocess under RLIMIT_NOFILE args.nofile."""
    import subprocess

    sys.path.insert(0, str(ROOT / "tests"))
    from brokers import Mosquitto, free_port

    from agent.artifacts.store import ContentStore

    sha = ContentStore(tmp / "cp").put_bytes(os.urandom(1 << 20))
    port = free_port()

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_NOFILE, (args.nofile, args.nofile))

    with Mosquitto(tmp / "mosquitto") as broker:
        argv = [sys.executable, "-m", "agent", "fleet", "serve", "--store", str(tmp / "cp"), "--broker", broker.url]
        proc = subprocess.Popen(
            argv + ["--http", f"127.0.0.1:{port}"], cwd=ROOT, stdout=subprocess.DEVNULL, preexec_fn=limit
        )
        crowd: list[socket.socket] = []
        try:
            deadline = time.monotonic() + 120
            while True:
                try:
                    socket.create_connection(("127.0.0.1", port), timeout=5).close()
                    break
                except OSError:
                    if proc.poll() is not None or time.monotonic() > deadline:
                        raise SystemExit(f"fleet serve --http did not start ({proc.poll()})") from None
                    time.sleep(0.2)
            alone = _series(port, sha, args.requests)
            crowd = [  # from --peers loopback addresses (127.0.0.2, ...): the server holds 256 per address
                socket.create_connection(("127.0.0.1", port), source_address=(f"127.0.0.{2 + n % args.peers}", 0))
                for n in range(args.idle)
            ]
            time.sleep(1.0)  # let the server accept them all
            counts = _proc_count(proc.pid)
            beside = _series(port, sha, args.requests)
            alive = proc.poll() is None
        finally:
            for s in crowd:
                s.close()
            proc.terminate()
            proc.wait(30)
    return {"alone": alone, "beside": beside, "idle_connections_opened": len(crowd), **counts, "alive": alive}


def main() -> None:
    from agent.artifacts.store import ContentStore
    from agent.fleet.blob_http import BlobServer

    ap = argparse.ArgumentParser()
    ap.add_argument("--idle", type=int, default=1000)
    ap.add_argument("--requests", type=int, default=50)
    ap.add_argument("--cli", action="store_true", help="measure `edge-agent fleet serve --http` in a subprocess")
    ap.add_argument("--nofile", type=int, default=1024, help="--cli: the server's RLIMIT_NOFILE")
    ap.add_argument("--peers", type=int, default=1, help="--cli: spread the idle crowd over this many addresses")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, max(soft, 3 * args.idle + 256)), hard))
    if args.cli:
        with tempfile.TemporaryDirectory() as tmp:
            got = _cli(args, Path(tmp))
        alone, beside = got.pop("alone"), got.pop("beside")
        doc = {
            "server": f"edge-agent fleet serve --http (subprocess, RLIMIT_NOFILE {args.nofile})",
            "crowd_peers": args.peers,
            **got,
            "requests": args.requests,
            "alone_median_ms": round(statistics.median(alone) * 1000, 3),
            "alone_max_ms": round(max(alone) * 1000, 3),
            "beside_median_ms": round(statistics.median(beside) * 1000, 3),
            "beside_max_ms": round(max(beside) * 1000, 3),
            "how": "wall time of one 64 KiB Range request on a fresh loopback connection, client side",
            "loadavg": os.getloadavg(),
        }
        print(json.dumps(doc, indent=2) if args.json else " ".join(f"{k}={v}" for k, v in doc.items()))
        return
    with tempfile.TemporaryDirectory() as tmp:
        store = ContentStore(Path(tmp) / "cp")
        sha = store.put_bytes(os.urandom(1 << 20))
        server = BlobServer(store, max_per_peer=args.idle + 64).start()
        try:
            alone = _series(server.port, sha, args.requests)
            crowd = [socket.create_connection(("127.0.0.1", server.port)) for _ in range(args.idle)]
            while server.open_connections < args.idle:
                time.sleep(0.05)
            beside = _series(server.port, sha, args.requests)
            held = server.open_connections
            for s in crowd:
                s.close()
        finally:
            server.shutdown()
    doc = {
        "idle_connections_held": held,
        "requests": args.requests,
        "alone_median_ms": round(statistics.median(alone) * 1000, 3),
        "alone_max_ms": round(max(alone) * 1000, 3),
        "beside_median_ms": round(statistics.median(beside) * 1000, 3),
        "beside_max_ms": round(max(beside) * 1000, 3),
        "median_ratio": round(statistics.median(beside) / statistics.median(alone), 2),
        "how": "wall time of one 64 KiB Range request on a fresh loopback connection, client side",
    }
    print(json.dumps(doc, indent=2) if args.json else " ".join(f"{k}={v}" for k, v in doc.items()))


if __name__ == "__main__":
    main()
