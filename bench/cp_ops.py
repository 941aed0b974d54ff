#!/usr/bin/env python3
"""The control plane's service CPU per operation, paired: the same steps against one or more code trees, in
alternating rounds on the same host, so a comparison of two commits shares the host's load (issue 38).

    .venv/bin/python bench/cp_ops.py [--devices 1000] [--rounds 2] [--code DIR ...] [--profile DIR]

`--code DIR` (repeatable; default: this checkout) is a tree whose `agent` package the service runs (`git archive
COMMIT | tar -x -C DIR` makes one); the light fleet and the client always run this checkout's code. Each run: a
fresh PostgreSQL database (one server for the whole bench, fsync off), a private Mosquitto, a light fleet of
--devices, and `edge-agent control-plane` in its own process (its CPU read from /proc), then, as
bench/cp_scale.py measures them:
  enroll       service CPU per enrollment (signed requests through POST /api/v1/enroll, 8 at a time) and the rate
  ingest       service CPU per status (every device's signed retained status until each is kept), gross and net of
               the service's CPU at rest (measured for 10 s before)
  decisions    signed decision records for distinct devices posted by 8 threads: records/s and service CPU per
               record
No pages, autovacuum wait or rollout (bench/cp_scale.py has those). Prints a JSON line per run, then per tree the
median of each figure over the rounds. --profile DIR runs each service under cProfile in every thread
(bench/cp_profile.py) and leaves DIR/TREE-ROUND.pstats. Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests"), str(ROOT / "bench")]

FIGURES = ("enroll_cpu_ms", "enroll_per_s", "rest_cpu_ms_per_s", "ingest_cpu_ms", "ingest_net_cpu_ms",
           "decision_cpu_ms", "decisions_per_s")  # fmt: skip


def one_run(code: Path, n: int, db_url: str, broker, tmp: Path, profile: str) -> dict:
    import httpx
    from cp_scale import cpu_s, ingest, post_decisions, start_service

    from agent.artifacts.keys import generate
    from agent.sim.light import LightFleet, LightOptions
    from agent.transport.mqtt import BrokerConfig

    key, pub, _ = generate(tmp / "fleet-keys")
    opts = LightOptions(id_prefix=f"o{n}", probation_s=2.0, clients=4, workers=32)
    fleet = LightFleet(n, BrokerConfig(broker.url), [str(pub)], opts)
    proc, url, token = start_service(tmp, db_url, broker.url, key, profile, code=code)
    out: dict = {"code": str(code), "devices": n}
    try:
        fleet.control_plane = url
        h = {"Authorization": f"Bearer {token}"}
        grant = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "bench", "uses": n}, headers=h).json()
        fleet.enroll_token = grant["token"]
        c0, t0 = cpu_s(proc.pid), time.perf_counter()
        fleet.enroll()
        c1, t1 = cpu_s(proc.pid), time.perf_counter()
        out["enroll_cpu_ms"] = round((c1 - c0) / n * 1000, 2)
        out["enroll_per_s"] = round(n / (t1 - t0), 1)
        ingest(proc.pid, fleet, db_url, out)
        c2 = cpu_s(proc.pid)
        out["decisions_per_s"] = round(post_decisions(url, fleet, n), 1)
        out["decision_cpu_ms"] = round((cpu_s(proc.pid) - c2) / n * 1000, 2)
        fleet.stop()
    except Exception:
        print((tmp / "cp.log").read_text()[-3000:], file=sys.stderr)  # the service's side of the failure
        raise
    finally:  # SIGINT: a clean stop in any commit's service (the profile is written at exit)
        proc.send_signal(signal.SIGINT if profile else signal.SIGTERM)
        proc.wait(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=1000)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--code", action="append", default=[], metavar="DIR", help="a tree the service runs (repeatable)")
    ap.add_argument("--profile", default="", metavar="DIR", help="cProfile each service: DIR/TREE-ROUND.pstats")
    args = ap.parse_args()
    from brokers import Mosquitto
    from cp_scale import autovacuum_every, new_database
    from cp_support import postgres

    codes = [Path(c).resolve() for c in args.code] or [ROOT]
    runs: dict[str, list[dict]] = {str(c): [] for c in codes}
    with tempfile.TemporaryDirectory(prefix="cp-ops-") as td:
        tmp = Path(td)
        with postgres(tmp / "pg") as pg:
            autovacuum_every(pg, 10)
            for r in range(args.rounds):
                for i, code in enumerate(codes):
                    where = tmp / f"r{r}-{i}"
                    where.mkdir()
                    prof = str(Path(args.profile).resolve() / f"{code.name}-{r}.pstats") if args.profile else ""
                    with Mosquitto(where / "mq") as broker:
                        got = one_run(code, args.devices, new_database(pg, r * 100 + i), broker, where, prof)
                    print(json.dumps(got), flush=True)
                    runs[str(code)].append(got)
    for code, got in runs.items():
        med = {k: round(statistics.median(g[k] for g in got), 2) for k in FIGURES}
        print(json.dumps({"code": code, "median_of": len(got), **med}), flush=True)


if __name__ == "__main__":
    main()
