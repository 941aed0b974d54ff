"""Paired verdicts in the daemon (issue 36), `bench/paired_verdicts.py --daemon`: whole trials (a DeviceAgent
in-process over real HTTP: inbox, qualification, shadow, swap, probation, rollback; tests/paired_trial.py, as
tests/test_paired_probation.py runs them) of a 2x-compute version and of an equal-compute version against a
committed version 1, --trials of each per load (none, two busy loops, the hog pinned to another core).

A wrong verdict: the 2x version committed, or stopped without a paired "slower" naming the ratio, or "not judged"
beside anything but the busy loops (then rolled back by serving.unjudged); the equal version not committed. Printed per load with the host's load average and PSI
(the host may be shared: other work on it is part of what the figures saw)."""

from __future__ import annotations

import argparse
import json
import os
import tempfile
import time
from pathlib import Path
from typing import Any

from paired_trial import corunners, daemon_trial, paired_of

from agent.trial import conditions


def one(kind: str, redundant: bool, ms: float) -> dict[str, Any]:
    """One daemon trial: the deployment's end, the paired verdict that decided, where, and whether it is wrong."""
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        _, dep, _, errors = daemon_trial(Path(tmp), redundant, ms)
    paired = paired_of(dep)
    state, reason = dep.state.value, dep.reason or ""
    if redundant:
        unjudged = paired["verdict"] == "not judged" and kind == "busy" and state == "rolled_back"
        stopped = paired["verdict"] == "slower" and state in ("rolled_back", "failed")
        right = unjudged or (stopped and "paired compute ratio" in reason)
    else:
        right = state == "committed"
    return {
        "version": "2x" if redundant else "equal",
        "state": state,
        "where": "probation" if isinstance(dep.data.get("probation"), dict) else "shadow",
        "paired": paired["verdict"],
        "ratio": paired["ratio"],
        "ci": paired["ci"],
        "pairs": paired["pairs"],
        "aa_ci": paired["aa"]["ci"],
        "paired_runs": (dep.data.get("probation") or {}).get("paired_runs"),  # None: decided in shadow
        "wrong": not right or bool(errors),
        "client_errors": len(errors),
        "seconds": round(time.perf_counter() - t0, 1),
    }


def run_load(kind: str, trials: int, ms: float) -> dict[str, Any]:
    load0 = os.getloadavg()[0]
    with corunners(kind):
        rows = [one(kind, redundant, ms) for _ in range(trials) for redundant in (True, False)]
        cond = conditions.read()
    return {
        "load": kind,
        "trials": trials,
        "wrong": sum(r["wrong"] for r in rows),
        "wrong_2x": sum(r["wrong"] for r in rows if r["version"] == "2x"),
        "wrong_equal": sum(r["wrong"] for r in rows if r["version"] == "equal"),
        "loadavg_1m": [round(load0, 2), round(os.getloadavg()[0], 2)],
        "conditions": cond,
        "rows": rows,
    }


def main(args: argparse.Namespace) -> None:
    results = []
    for kind in args.loads.split(","):
        results.append(run_load(kind, args.trials, args.ms))
        if not args.json:
            show(results[-1])
    if args.json:
        print(json.dumps(results, indent=2))


def show(r: dict[str, Any]) -> None:
    c = r["conditions"]
    print(
        f"{r['load']:>5}: {r['trials']} trials of each version, wrong {r['wrong']} (2x {r['wrong_2x']}, "
        f"equal {r['wrong_equal']}); load average {r['loadavg_1m'][0]} -> {r['loadavg_1m'][1]}, "
        f"PSI cpu {c['psi_cpu_some_avg10']} mem {c['psi_memory_some_avg10']}, {c['cpu_mhz']} MHz"
    )
    for row in r["rows"]:
        print(
            f"       {row['version']:>5} {row['state']:<11} by {row['where']:<9} paired {row['paired']:<10} "
            f"x{row['ratio']} {row['ci']} over {row['pairs']} pairs, A/A {row['aa_ci']}, {row['seconds']} s"
            + (" WRONG" if row["wrong"] else ""),
            flush=True,
        )
        c = row["paired_runs"]
        if c:
            print(
                f"             probation: {c['offered']} offered, {c['over_budget']} over budget, {c['dropped']} pairs "
                f"dropped, {c['retried']} of {c['runs']} runs again after contention, {c['carried']} from shadow, "
                f"mirrored share {c['share']}",
                flush=True,
            )
