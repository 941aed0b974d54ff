"""Qualification at the cost of a plain loop: the wall time of `qualify` on a small real CNN (onnx's
light_squeezenet) over the wall time of a plain script doing the same work (start Python, import the runtimes,
per row: open the session, one accuracy run, the same warm-up and timed runs qualify made), in the same run,
alternating. Modes: `fresh`, qualify in a freshly spawned interpreter, as `edge-agent qualify` or the daemon's
qualification child (its row workers fork from a server it starts itself); `in-process`, qualify in this process
(the fork server started by the first round is reused after); `spawned`, a freshly spawned worker per row
(EDGE_AGENT_SPAWN_WORKERS=1, the former way). Each round prints where the time went on both sides (the phases of
`Timeline`, and the plain loop's sessions and runs) and the time each spent beside the runs. Goal: <= 1.2x.

    .venv/bin/python bench/bench_qualify_cost.py [--providers cpu openvino] [--budget 1] [--rounds 2]
        [--modes fresh in-process spawned] [--openvino-devices CPU HETERO:CPU] [--always-confirm]
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


def plain_loop(conn, model_path: str, rows: list[dict[str, Any]], feeds: dict, latency_feeds: dict) -> None:
    """Child (spawned: a fresh interpreter, as a user's script): the same sessions and runs, nothing else; sends
    back the seconds its sessions (with the one accuracy run) and its runs took."""
    from agent.providers import get

    sessions_s = runs_s = 0.0
    for r in rows:
        t0 = time.perf_counter()
        sess = get(r["provider"]).open_session(
            model_path, options=r["options"], precision=r["precision"], device=r["device"]
        )
        sess.run(feeds)
        t1 = time.perf_counter()
        for _ in range(r["runs"]):
            sess.run(latency_feeds)
        t2 = time.perf_counter()
        sess.close()
        sessions_s, runs_s = sessions_s + (t1 - t0), runs_s + (t2 - t1)
    conn.send({"sessions+accuracy": sessions_s, "runs": runs_s})
    conn.close()


def _plain_wall(model_path: str, rows: list[dict[str, Any]], feeds: dict, latency_feeds: dict):
    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    p = ctx.Process(target=plain_loop, args=(theirs, model_path, rows, feeds, latency_feeds))
    p.start()
    theirs.close()
    phases = ours.recv()
    p.join()
    if p.exitcode != 0:
        raise SystemExit(f"the plain loop failed (exit {p.exitcode})")
    wall = time.perf_counter() - t0
    return wall, {"interpreter+imports": wall - sum(phases.values()), **phases}


class Timeline:
    """Where a qualification's wall time goes, from its progress events (the parent's clock): setup before the
    first row, per row the worker start (fork or spawn) up to the child's `session` event, session creation and
    accuracy up to `latency`, the timed runs up to `session_times`, then cold/warm sessions and the result's way
    back; per row of a close call's confirmation round its start (a kept worker's session, or a fork and a new
    session) up to `latency`, then its warm-up and timed runs (counted with the timed runs: the plain loop makes
    them too); selection after the last of these."""

    PHASES = (
        "setup",
        "worker start",
        "session+accuracy",
        "timed runs",
        "cold/warm+return",
        "between rows",
        "confirm start",
        "select",
    )

    def __init__(self) -> None:
        self.t0 = time.perf_counter()
        self.marks: list[tuple[str, float]] = []

    def __call__(self, event: str, **fields: Any) -> None:
        status = fields.get("status")
        name = {"row": "row-start" if status == "running" else "row-end"}.get(event, event)
        self.marks.append((name, time.perf_counter()))

    def phases(self, end: float) -> dict[str, float]:
        out = dict.fromkeys(self.PHASES, 0.0)
        first = next((t for n, t in self.marks if n == "row-start"), end)
        out["setup"] = first - self.t0
        row_next = {"session": "session+accuracy", "latency": "timed runs", "session_times": "cold/warm+return"}
        last_end, state, since, confirming = None, None, first, False
        for name, t in self.marks:
            if name == "row-start":
                if last_end is not None:
                    out["between rows"] += t - last_end
                state, since = "worker start", t
            elif name in ("confirm", "selected"):
                if state is not None:
                    out[state] += t - since
                elif last_end is not None and not confirming:
                    out["between rows"] += t - last_end
                confirming = True
                state, since = ("confirm start" if name == "confirm" else "select"), t
            elif confirming:
                if name == "latency" and state == "confirm start":
                    out[state] += t - since
                    state, since = "timed runs", t
            elif state is not None and name in ("session", "latency", "session_times", "row-end"):
                if name == "latency" and state == "timed runs":
                    continue  # the latency loop's own progress reports
                out[state] += t - since
                state, since = (None, t) if name == "row-end" else (row_next[name], t)
                if name == "row-end":
                    last_end = t
        if state is not None:
            out[state] += end - since
        return out


def _qualify_wall(pkg, profile, target, providers: list[str], budget: float, spawn: bool, confirm: bool = False):
    """`qualify` in this process (its fork server, once started by the first call, is reused after). confirm:
    every qualification has a close call's confirmation round (CLOSE_CALL without bound)."""
    from agent.isolate.forkserver import SPAWN_ENV
    from agent.qualify import harness
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions

    if confirm:
        harness.CLOSE_CALL = float("inf")

    os.environ[SPAWN_ENV] = "1" if spawn else "0"
    line = Timeline()
    d = qualify(
        pkg, profile, target, providers=providers, options=QualifyOptions(latency_budget_s=budget), progress=line
    )
    end = time.perf_counter()
    return end - line.t0, d, line.phases(end)


def fresh_qualify(conn, package: str, target: Any, providers: list[str], budget: float, confirm: bool) -> None:
    """Child (spawned: a fresh interpreter, as `edge-agent qualify` or the daemon's qualification child): detect,
    load, qualify; its row workers fork from a fork server it starts itself, first thing (as the CLI does)."""
    os.environ.pop("EDGE_AGENT_SPAWN_WORKERS", None)
    from agent.isolate import forkserver

    forkserver.prewarm()
    from agent.hardware import detect
    from agent.package.load import load_package

    _, d, phases = _qualify_wall(load_package(package), detect("/"), target, providers, budget, False, confirm)
    conn.send((d.to_dict(), phases))
    conn.close()


def _fresh_wall(package: str, target: Any, providers: list[str], budget: float, confirm: bool):
    from agent.qualify.decision import Decision

    ctx = mp.get_context("spawn")
    ours, theirs = ctx.Pipe(duplex=False)
    t0 = time.perf_counter()
    p = ctx.Process(target=fresh_qualify, args=(theirs, package, target, providers, budget, confirm))
    p.start()
    theirs.close()
    doc, phases = ours.recv()
    p.join()
    wall = time.perf_counter() - t0
    phases["interpreter+imports"] = wall - sum(phases.values())
    return wall, Decision.from_dict(doc), phases


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


MODES = ("fresh", "in-process", "spawned")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", nargs="*", default=None, help="default: the target's available providers")
    ap.add_argument("--budget", type=float, default=1.0, help="qualify's latency budget per row (s)")
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--model", default="light_squeezenet")
    ap.add_argument(
        "--modes", nargs="*", default=list(MODES[:2]), choices=MODES, help=f"default: {' '.join(MODES[:2])}"
    )
    ap.add_argument(
        "--openvino-devices",
        nargs="*",
        default=None,
        help="device strings for the openvino rows (e.g. CPU HETERO:CPU: one row each); default: the target's",
    )
    ap.add_argument(
        "--always-confirm",
        action="store_true",
        help="every qualification gets the close-call confirmation round (as on a quiet host, where openvino@CPU "
        "and openvino@HETERO:CPU always tie)",
    )
    args = ap.parse_args()

    import dataclasses

    from agent.conformance.models import light_packages
    from agent.hardware import detect
    from agent.package.inputs import package_plan
    from agent.package.load import load_package
    from agent.providers import get
    from agent.targets import match

    profile = detect("/")
    target = match(profile)
    if args.openvino_devices:
        prefs = [
            dataclasses.replace(p, options={**p.options, "devices": args.openvino_devices})
            if p.name == "openvino"
            else p
            for p in target.providers
        ]
        target = dataclasses.replace(target, providers=tuple(prefs))
    names = args.providers or [
        p.name for p in target.providers if get(p.name).probe(profile, dict(p.options)).available
    ]
    pkg = load_package(light_packages(Path(tempfile.mkdtemp(prefix="bench-cost-")), [args.model])[0])
    plan = package_plan(pkg)
    ratios: dict[str, list[float]] = {m: [] for m in args.modes}
    for i in range(args.rounds):
        for mode in args.modes:
            if mode == "fresh":
                q_s, d, phases = _fresh_wall(str(pkg.root), target, names, args.budget, args.always_confirm)
            else:
                q_s, d, phases = _qualify_wall(
                    pkg, profile, target, names, args.budget, mode == "spawned", args.always_confirm
                )
            rows = _rows(d)
            plain_s, plain_phases = _plain_wall(str(pkg.model_path), rows, plan.accuracy, plan.latency)
            ratios[mode].append(q_s / plain_s)
            runs = sum(r["runs"] for r in rows)
            print(
                f"round {i + 1} {mode:10s}: qualify {q_s:6.2f} s, plain loop {plain_s:6.2f} s "
                f"({len(rows)} rows {', '.join(r.key for r in d.results if r.latency_ms)}; {runs} runs; "
                f"{sum(1 for r in d.results if (r.latency_ms or {}).get('rounds') == 2)} confirmed) "
                f"-> {q_s / plain_s:.2f}x",
                flush=True,
            )
            print("    qualify: " + ", ".join(f"{k} {v:.2f} s" for k, v in phases.items()), flush=True)
            print("    plain:   " + ", ".join(f"{k} {v:.2f} s" for k, v in plain_phases.items()), flush=True)
            fixed = (q_s - phases["timed runs"], plain_s - plain_phases["runs"])
            print(f"    beside the runs: qualify {fixed[0]:.2f} s, plain loop {fixed[1]:.2f} s", flush=True)
    for mode, rs in ratios.items():
        print(f"{mode:10s} qualification / plain loop: median {statistics.median(rs):.2f}x over {len(rs)} rounds")
    print(f"model {args.model}; providers {', '.join(names)}; goal <= 1.2x with the fork server")


if __name__ == "__main__":
    main()
