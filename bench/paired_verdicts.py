"""Paired verdicts under load (issue 36): how often the paired judge is wrong, how fast it decides a true 2x, its
A/A false-"slower" rate, and what mirroring costs the serving CPU, with nothing else running, beside two busy
loops, and beside a memory-bandwidth hog pinned to one core (taskset, a numpy copy over 256 MB).

  wrong verdicts (2x judged "not slower", 1x judged "slower")                         goal 0
  pairs / seconds to decide a true 2x                                                 goal <= 200 pairs or 60 s
  A/A false "slower" rate                                                             goal < 1 %
  mirrored CPU / serving CPU                                                          goal <= the budget (10 %)

Usage: .venv/bin/python bench/paired_verdicts.py [--trials 10] [--max-s 60] [--ms 2.0] [--clients 1]
                                                 [--share 0.1] [--loads none,busy,hog] [--json] [--daemon]
                                                 [--no-twin]
--no-twin: the pairs time the served candidate itself (serving.probation.paired_twin false), not a twin of it.
--daemon: the same loads around whole trials in the daemon (bench/paired_daemon.py: inbox, shadow, swap, probation,
rollback; tests/paired_trial.py, as tests/test_paired_probation.py runs them), --trials of each version per load,
printing the wrong verdicts per load (--ms, --loads, --json apply; the daemon's trial settings are the test's).
Each trial does what probation does (agent/lifecycle/stages/watch.py start_pairing): the registry serves the
candidate with the incumbent kept as the referee, in-process clients call registry.infer, and a Pairing runs
pairs on copies of their requests within --share of the serving CPU; the judge (agent/trial/pairjudge.py, the
daemon's defaults) is asked every 0.25 s until it decides or --max-s passes. The A/A rate: 1000 blocks of 16
"candidate" and 8 floor pairs drawn from the A/A pairs the load's trials took, judged as a candidate is.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import onnx

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "tests"))

from paired_trial import corunners  # noqa: E402
from probation_models import WIDTH, chain_depth, chain_model  # noqa: E402

from agent.providers import get  # noqa: E402
from agent.serving.registry import ModelRegistry  # noqa: E402
from agent.trial import conditions  # noqa: E402
from agent.trial.paired import Pairing  # noqa: E402
from agent.trial.pairjudge import NOT_JUDGED, NOT_SLOWER, SLOWER, PairedRule, judge  # noqa: E402
from agent.trial.twin import CANDIDATE, Twin  # noqa: E402


def _session(path: Path):
    return get("cpu").open_session(path, options={"intra_op_num_threads": 1})


def trial(paths: dict[str, Path], candidate: str, clients: int, share: float, max_s: float, twin: bool = True) -> dict:
    """One probation-like trial: (verdict, pairs, seconds to the verdict, A/A log ratios, mirrored share)."""
    reg = ModelRegistry()
    reg.activate("m", "1", _session(paths["1x"]))
    reg.activate("m", "2", _session(paths[candidate]), keep_previous=True)  # the incumbent is the referee
    ref = reg.referee_session("m")
    assert ref is not None
    pairing = Pairing(ref[1], reg.entry("m").session, reg.gate, share=share)
    if twin:  # as the daemon does (serving.probation.paired_twin): the served candidate timed on a twin
        pairing.twin = Twin(CANDIDATE, lambda: _session(paths[candidate]), reg.gate)
    pairing.start()
    reg.observe("m", pairing)
    stop = threading.Event()
    x = {"x": np.random.default_rng(1).standard_normal((1, WIDTH)).astype(np.float32)}
    served, failed = [0], [0]

    def client() -> None:
        while not stop.is_set():
            try:
                reg.infer("m", x)
                served[0] += 1
            except Exception:  # noqa: BLE001 - counted: mirroring must fail no request
                failed[0] += 1

    threads = [threading.Thread(target=client, daemon=True) for _ in range(clients)]
    for t in threads:
        t.start()
    t0 = time.perf_counter()
    said = judge([], [], PairedRule())
    try:
        while time.perf_counter() - t0 < max_s:
            time.sleep(0.25)
            said = judge(list(pairing.pairs), list(pairing.aa), PairedRule())
            if said.verdict != NOT_JUDGED:
                break
    finally:
        took = time.perf_counter() - t0
        stop.set()
        for t in threads:
            t.join(30)
        reg.observe("m", pairing, on=False)
        pairing.stop()
        counts = pairing.counts()
        reg.close()
    return {
        "candidate": candidate,
        "verdict": said.verdict,
        "ratio": said.candidate.ratio,
        "pairs": said.candidate.pairs,
        "seconds": round(took, 2),
        "aa": list(pairing.aa),
        "share": counts["share"],
        "requests": served[0],
        "failed": failed[0],
    }


def aa_rate(aa: list[float], blocks: int = 1000) -> tuple[int, int]:
    """(blocks judged "slower", blocks judged): blocks of 16 "candidate" and 8 floor pairs drawn with replacement
    from the A/A pairs this load's trials took (their real noise under the load), judged as a candidate is."""
    if len(aa) < 24:
        return 0, 0
    rng = np.random.default_rng(0)
    slower = 0
    for _ in range(blocks):
        draw = rng.choice(np.asarray(aa), 24)
        slower += judge(list(draw[:16]), list(draw[16:]), PairedRule()).verdict == SLOWER
    return slower, blocks


def _median(values: list) -> float | None:
    kept = [v for v in values if v is not None]
    return float(np.median(kept)) if kept else None


def run_load(kind: str, paths: dict[str, Path], args: argparse.Namespace) -> dict:
    with corunners(kind):
        rows = [
            trial(paths, c, args.clients, args.share, args.max_s, not args.no_twin)
            for _ in range(args.trials)
            for c in ("2x", "eq")
        ]
        cond = conditions.read()
    slow = [r for r in rows if r["candidate"] == "2x"]
    wrong = sum(r["verdict"] == NOT_SLOWER for r in slow) + sum(
        r["verdict"] == SLOWER for r in rows if r["candidate"] == "eq"
    )
    decided = [r for r in slow if r["verdict"] == SLOWER]
    aa = [v for r in rows for v in r["aa"]]
    aa_slower, aa_blocks = aa_rate(aa)
    shares = [r["share"] for r in rows if r["share"] is not None]
    return {
        "load": kind,
        "trials": args.trials,
        "wrong": wrong,
        "not_judged": sum(r["verdict"] == NOT_JUDGED for r in rows),
        "decided_2x": len(decided),
        "pairs_to_2x_max": max((r["pairs"] for r in decided), default=None),
        "seconds_to_2x_max": max((r["seconds"] for r in decided), default=None),
        "ratio_2x_median": float(np.median([r["ratio"] for r in decided])) if decided else None,
        "ratio_eq_median": _median([r["ratio"] for r in rows if r["candidate"] == "eq"]),
        "aa_pairs": len(aa),
        "aa_false_slower": f"{aa_slower}/{aa_blocks}",
        "mirrored_share_max": max(shares, default=None),
        "requests": sum(r["requests"] for r in rows),
        "failed_requests": sum(r["failed"] for r in rows),
        "conditions": cond,
        "rows": [{k: v for k, v in r.items() if k != "aa"} for r in rows],
    }


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--max-s", type=float, default=60.0)
    ap.add_argument("--ms", type=float, default=2.0, help="the 1x chain's CPU ms a run (sized on this host)")
    ap.add_argument("--clients", type=int, default=1)
    ap.add_argument("--share", type=float, default=0.1)
    ap.add_argument("--loads", default="none,busy,hog")
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--no-twin", action="store_true", help="time the served candidate itself, not a twin")
    ap.add_argument("--daemon", action="store_true", help="whole trials in the daemon (bench/paired_daemon.py)")
    args = ap.parse_args()
    if args.daemon:
        from paired_daemon import main as daemon_main

        daemon_main(args)
        return
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        depth = chain_depth(d, args.ms)
        paths = {"1x": d / "1x.onnx", "eq": d / "eq.onnx", "2x": d / "2x.onnx"}
        onnx.save(chain_model(depth=depth, bias=1.0), str(paths["1x"]))
        onnx.save(chain_model(depth=depth, bias=1.0), str(paths["eq"]))
        onnx.save(chain_model(depth=depth, redundant=True, bias=1.0), str(paths["2x"]))
        results = [run_load(kind, paths, args) for kind in args.loads.split(",")]
    if args.json:
        print(json.dumps(results, indent=2))
        return
    print(f"chain depth {depth} (~{args.ms} ms CPU a run), {args.trials} trials x (2x, equal) per load")
    for r in results:
        c = r["conditions"]
        print(
            f"{r['load']:>5}: wrong {r['wrong']}, not judged {r['not_judged']}, 2x decided {r['decided_2x']}/"
            f"{r['trials']} (median x{r['ratio_2x_median'] and round(r['ratio_2x_median'], 2)}, at most "
            f"{r['pairs_to_2x_max']} pairs / {r['seconds_to_2x_max']} s), equal copy median x"
            f"{r['ratio_eq_median'] and round(r['ratio_eq_median'], 2)}, A/A false slower {r['aa_false_slower']} "
            f"blocks ({r['aa_pairs']} A/A pairs), mirrored CPU <= {r['mirrored_share_max']} of serving, "
            f"{r['failed_requests']} of {r['requests']} requests failed; "
            f"PSI cpu {c['psi_cpu_some_avg10']} mem {c['psi_memory_some_avg10']}, {c['cpu_mhz']} MHz"
        )


if __name__ == "__main__":
    main()
