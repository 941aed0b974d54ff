"""Selection quality: on onnx's light_* models, does the engine's selected provider equal the one an
exhaustive measurement finds fastest within tolerance? The exhaustive side opens every provider variant,
checks accuracy against the golden outputs with the same tolerances, then times each in its own process
(one runtime per process, as in serving: two runtimes' spinning thread pools in one process distort each
other) for many more runs than qualify does, in alternating rounds. Agreement is reported per provider
(the question asked) and per variant (provider + precision).

    .venv/bin/python bench/bench_selection.py [--budget 2] [--runs 300] [--models light_resnet50 ...]
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from pathlib import Path

import numpy as np


def time_variant(
    model_path: str,
    provider: str,
    options: dict,
    precision,
    feeds: dict,
    golden: dict,
    tolerances: dict,
    runs: int,
    cap_s: float,
) -> dict:
    """Runs in a child (one runtime per process, as in serving): accuracy, then a plain timing loop."""
    from agent.errors import EdgeAgentError
    from agent.providers import get
    from agent.qualify import accuracy

    try:
        sess = get(provider).open_session(model_path, options=options, precision=precision)
        got = sess.run(feeds)
    except EdgeAgentError as exc:
        return {"ok": False, "reason": str(exc)[:80], "p50": None}
    tol = accuracy.as_tolerance(tolerances.get(sess.precision, tolerances.get(None)))
    bad = accuracy.violations(accuracy.compare(golden, got), tol)
    for _ in range(10):
        sess.run(feeds)
    samples, t_end = [], time.perf_counter() + cap_s
    while len(samples) < runs and (time.perf_counter() < t_end or len(samples) < 64):
        t0 = time.perf_counter()
        sess.run(feeds)
        samples.append((time.perf_counter() - t0) * 1e3)
    return {
        "ok": not bad,
        "reason": "; ".join(bad)[:80],
        "p50": float(np.percentile(samples, 50)),
        "runs": len(samples),
    }


def exhaustive(pkg, variants, target, runs: int, cap_s: float, rounds: int) -> dict[str, dict]:
    """key -> {p50, ok}: every variant in its own fresh process, `rounds` alternating rounds (A B C A B C ...)
    so load drift on a shared machine hits them alike; p50 = median of the round medians."""
    from agent.isolate.runner import IsolatedWorker
    from agent.package.inputs import package_inputs
    from agent.qualify.rowrunner import tolerances_for

    feeds, golden, _ = package_inputs(pkg)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    per: dict[str, list[dict]] = {v.key: [] for v in variants}
    for _ in range(rounds):
        for v in variants:
            kwargs = {
                "model_path": str(pkg.model_path),
                "provider": v.provider,
                "options": v.options,
                "precision": v.precision,
                "feeds": feeds,
                "golden": golden,
                "tolerances": tolerances_for(target, pkg, v.provider),
                "runs": runs,
                "cap_s": cap_s,
            }
            with IsolatedWorker(env=env) as w:
                res = w.call("bench_selection:time_variant", kwargs, timeout=cap_s * 4 + 120)
            per[v.key].append(res.value if res.ok else {"ok": False, "reason": res.error[:80], "p50": None})
    out = {}
    for key, rs in per.items():
        p50s = [r["p50"] for r in rs if r.get("p50") is not None]
        out[key] = {
            "ok": all(r["ok"] for r in rs),
            "p50": float(np.median(p50s)) if p50s else None,
            "reason": rs[0].get("reason", ""),
        }
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=2.0, help="qualify's latency budget per row (s)")
    ap.add_argument("--runs", type=int, default=300, help="exhaustive timed runs per variant")
    ap.add_argument("--cap", type=float, default=10.0, help="exhaustive time cap per variant and round (s)")
    ap.add_argument("--rounds", type=int, default=3, help="alternating exhaustive rounds per model")
    ap.add_argument("--models", nargs="*", help="light_* model names (default: all)")
    args = ap.parse_args()

    from agent.conformance.models import light_packages
    from agent.conformance.runner import variants_for
    from agent.hardware import detect
    from agent.package.load import load_package
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions
    from agent.targets import match

    profile = detect("/")
    target = match(profile)
    variants, _ = variants_for(None, profile, target)
    names = list(dict.fromkeys(v.provider for v in variants))
    print(f"target {target.name}; variants {', '.join(v.key for v in variants)}")
    agree = exact = near = total = 0
    for path in light_packages(Path(tempfile.mkdtemp(prefix="bench-sel-")), args.models):
        pkg = load_package(path)
        decision = qualify(pkg, profile, target, providers=names, options=QualifyOptions(latency_budget_s=args.budget))
        ex = exhaustive(pkg, variants, target, args.runs, args.cap, args.rounds)
        passing = {k: v for k, v in ex.items() if v["ok"] and v["p50"] is not None}
        best = min(passing, key=lambda k: passing[k]["p50"]) if passing else None
        pick = decision.selected_key
        total += 1
        same_provider = (pick or "").split(":")[0] == (best or "").split(":")[0]
        agree += same_provider
        exact += pick == best
        close = pick == best or (pick in passing and best and passing[pick]["p50"] <= passing[best]["p50"] * 1.05)
        near += bool(close)
        cells = "  ".join(
            f"{k}={v['p50']:.3g}ms{'' if v['ok'] else '(x)'}" if v["p50"] else f"{k}=n/a(x)" for k, v in ex.items()
        )
        verdict = "AGREE" if same_provider else ("within 5%" if close else "DISAGREE")
        print(f"{pkg.name:22s} selected {str(pick):14s} exhaustive-best {str(best):14s} {verdict:9s} | {cells}")
    print(
        f"agreement: provider {agree}/{total}; exact variant {exact}/{total}; "
        f"selected within 5% of the exhaustive best p50: {near}/{total}"
    )
    print("(x) = outside tolerance against the golden outputs")


if __name__ == "__main__":
    main()
