"""Shadow phase cost: serving p99 while a candidate shadows the incumbent / steady p99, same run, same clients.

  serving p99 during a shadow phase / steady p99 at 4 HTTP clients                   goal <= 1.1

Usage: .venv/bin/python bench/bench_shadow.py [--clients 4] [--target-ms 1.0] [--model cnn|matmul] [--rounds 8]
                                              [--window-s 3] [--cpu-share 0.05] [--json]
Steady and shadow windows alternate (`--rounds` of each, `--window-s` seconds long, the order flipping every
round), so load drift on a shared machine hits both alike. A shadow window does what the daemon's shadow phase does (agent/lifecycle/stages/watch.py):
the incumbent's responses are all sampled (NaN/Inf check, CPU time) and a warmed candidate session (another
seed of the same model) answers copies of live requests within serving.shadow.cpu_share. Clients are
bench_serving's lean keep-alive clients in another process (binary tensors).
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench_serving import _load_clients, calibrate, log, pct  # noqa: E402

from agent.serving.http.server import OIPServer  # noqa: E402
from agent.serving.memory import MMAP_THRESHOLD, fix_mmap_threshold, limit_malloc_arenas  # noqa: E402
from agent.serving.registry import ModelRegistry  # noqa: E402
from agent.trial.settings import ShadowConfig  # noqa: E402
from agent.trial.shadow import Shadow  # noqa: E402


def bench_shadow(directory: Path, model, clients: int, rounds: int, window_s: float, cpu_share: float) -> dict:
    reg = ModelRegistry(drain_timeout=60)
    reg.activate("m", "1", model.open(directory, seed=0))
    candidate = model.open(directory, seed=0)  # same weights: agreement 1.0, as for a good new version
    srv = OIPServer(reg, port=0).start()
    ctx = mp.get_context("spawn")
    q, stop = ctx.Queue(), ctx.Event()
    p = ctx.Process(target=_load_clients, args=(srv.port, model.kind, model.size, clients, stop, q))
    p.start()
    time.sleep(2.0)  # clients connect and warm up (excluded from both windows)
    stats = reg.model_stats("m", "1")
    while stats.snapshot()["requests"] < 1500:  # past a version's first 1000: 1 in 16 sampled, as in use
        time.sleep(0.2)
    steady, shadowing, results = [], [], []
    config = ShadowConfig(requests=10**9, duration_s=window_s, min_requests=1, cpu_share=cpu_share)

    def steady_window() -> None:
        t = time.time()
        time.sleep(window_s)
        steady.append((t, time.time()))

    def shadow_window() -> None:
        shadow = Shadow(candidate, config)
        stats.watch(True)
        reg.attach_shadow("m", shadow)
        t = time.time()
        results.append(shadow.run())
        shadowing.append((t, time.time()))
        reg.attach_shadow("m", None)
        stats.watch(False)

    for i in range(rounds):  # the order alternates: neither kind always follows the other
        for window in (steady_window, shadow_window) if i % 2 == 0 else (shadow_window, steady_window):
            window()
    stop.set()
    samples = [s for _ in range(clients) for s in q.get(timeout=600)]
    p.join(60)
    srv.shutdown(10)
    candidate.close()
    reg.close()

    def within(windows):
        return [lat for t, lat, ok in samples if ok and any(a <= t < b for a, b in windows)]

    calm, busy = within(steady), within(shadowing)
    return {
        "model": str(model),
        "clients": clients,
        "cpu_share": cpu_share,
        "requests": len(samples),
        "failed": sum(1 for *_, ok in samples if not ok),
        "steady_requests": len(calm),
        "shadow_requests": len(busy),
        "shadowed": sum(r.get("requests", 0) for r in results),
        "agreement": min((r["agreement"] for r in results if r.get("agreement") is not None), default=None),
        "latency_ratio": [r.get("latency_ratio") for r in results],
        "steady_p99_ms": pct(calm, 99) * 1e3,
        "shadow_p99_ms": pct(busy, 99) * 1e3,
        "p99_ratio": pct(busy, 99) / pct(calm, 99),
        "steady_p50_ms": pct(calm, 50) * 1e3,
        "shadow_p50_ms": pct(busy, 50) * 1e3,
    }


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--clients", type=int, default=4)
    ap.add_argument("--target-ms", type=float, default=1.0)
    ap.add_argument("--model", choices=["cnn", "matmul"], default="cnn")
    ap.add_argument("--rounds", type=int, default=8)
    ap.add_argument("--window-s", type=float, default=3.0)
    ap.add_argument("--cpu-share", type=float, default=ShadowConfig.cpu_share)
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    limit_malloc_arenas(2)  # what the daemon does at start
    fix_mmap_threshold(MMAP_THRESHOLD)
    with tempfile.TemporaryDirectory(prefix="bench-shadow-") as tmp:
        d = Path(tmp)
        model = calibrate(d, args.model, args.target_ms)
        log(f"shadow vs steady under {args.clients} clients: {model} ...")
        r = bench_shadow(d, model, args.clients, args.rounds, args.window_s, args.cpu_share)
    r["cpus"] = os.cpu_count()
    if args.json:
        print(json.dumps(r, indent=2))
        return 0
    print(
        f"{r['cpus']} CPUs, {r['clients']} clients, {r['model']}, cpu_share {r['cpu_share']}: {r['requests']} requests, "
        f"{r['failed']} failed; {r['shadowed']} shadowed (agreement {r['agreement']}); p99 steady "
        f"{r['steady_p99_ms']:.2f} ms, during shadow {r['shadow_p99_ms']:.2f} ms -> {r['p99_ratio']:.3f} (goal <= 1.1); "
        f"p50 {r['steady_p50_ms']:.2f} -> {r['shadow_p50_ms']:.2f} ms"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
