"""Qualification at the cost of a plain loop: the wall time of `qualify` on a small real CNN (onnx's
light_squeezenet) over the wall time of a plain script doing the same work (start Python, import the runtimes,
per row: open the session, one accuracy run, the same warm-up and timed runs qualify made), in the same run,
alternating; once with row workers forked from the runtime-preloaded server (agent.qualify.forkserver) and once
with a freshly spawned worker per row (EDGE_AGENT_SPAWN_WORKERS=1, the former way). Goal: <= 1.2x.

    .venv/bin/python bench/bench_qualify_cost.py [--providers cpu openvino] [--budget 1] [--rounds 2]
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any


def plain_loop(model_path: str, rows: list[dict[str, Any]], feeds: dict, latency_feeds: dict) -> None:
    """Child (spawned: a fresh interpreter, as a user's script): the same sessions and runs, nothing else."""
    from agent.providers import get

    for r in rows:
        sess = get(r["provider"]).open_session(
            model_path, options=r["options"], precision=r["precision"], device=r["device"]
        )
        sess.run(feeds)
        for _ in range(r["runs"]):
            sess.run(latency_feeds)
        sess.close()


def _plain_wall(model_path: str, rows: list[dict[str, Any]], feeds: dict, latency_feeds: dict) -> float:
    ctx = mp.get_context("spawn")
    t0 = time.perf_counter()
    p = ctx.Process(target=plain_loop, args=(model_path, rows, feeds, latency_feeds))
    p.start()
    p.join()
    if p.exitcode != 0:
        raise SystemExit(f"the plain loop failed (exit {p.exitcode})")
    return time.perf_counter() - t0


def _qualify_wall(pkg, profile, target, providers: list[str], budget: float, spawn: bool):
    from agent.qualify.forkserver import SPAWN_ENV
    from agent.qualify.harness import qualify

    os.environ[SPAWN_ENV] = "1" if spawn else "0"
    t0 = time.perf_counter()
    d = qualify(pkg, profile, target, providers=providers, latency_budget_s=budget)
    return time.perf_counter() - t0, d


def _rows(d) -> list[dict[str, Any]]:
    out = []
    for r in d.results:
        lat = r.latency_ms or {}
        if not lat.get("runs"):
            continue
        runs = int(lat["runs"]) + int(lat.get("warmup_runs") or 0)
        if r.latency_max_ms:
            runs += int(r.latency_max_ms.get("runs") or 0) + int(r.latency_max_ms.get("warmup_runs") or 0)
        out.append(
            {
                "provider": r.provider,
                "options": r.options,
                "precision": r.requested_precision,
                "device": r.requested_device,
                "runs": runs,
            }
        )
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", nargs="*", default=None, help="default: the target's available providers")
    ap.add_argument("--budget", type=float, default=1.0, help="qualify's latency budget per row (s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="light_squeezenet")
    args = ap.parse_args()

    from agent.conformance.models import light_packages
    from agent.hardware import detect
    from agent.providers import get
    from agent.qualify.inputs import package_plan
    from agent.qualify.package import load_package
    from agent.targets import match

    profile = detect("/")
    target = match(profile)
    names = args.providers or [
        p.name for p in target.providers if get(p.name).probe(profile, dict(p.options)).available
    ]
    pkg = load_package(light_packages(Path(tempfile.mkdtemp(prefix="bench-cost-")), [args.model])[0])
    plan = package_plan(pkg)
    ratios: dict[str, list[float]] = {"forkserver": [], "spawned": []}
    for i in range(args.rounds):
        for mode in ("forkserver", "spawned"):
            q_s, d = _qualify_wall(pkg, profile, target, names, args.budget, spawn=mode == "spawned")
            rows = _rows(d)
            plain_s = _plain_wall(str(pkg.model_path), rows, plan.accuracy, plan.latency)
            ratios[mode].append(q_s / plain_s)
            runs = sum(r["runs"] for r in rows)
            print(
                f"round {i + 1} {mode:10s}: qualify {q_s:6.2f} s, plain loop {plain_s:6.2f} s "
                f"({len(rows)} rows, {runs} runs) -> {q_s / plain_s:.2f}x"
            )
    for mode, rs in ratios.items():
        print(f"{mode:10s} qualification / plain loop: median {statistics.median(rs):.2f}x over {len(rs)} rounds")
    print(f"model {args.model}; providers {', '.join(names)}; goal <= 1.2x with the forkserver")


if __name__ == "__main__":
    main()
