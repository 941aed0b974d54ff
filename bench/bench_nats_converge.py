"""Start-to-converge of one rollout to N simulated devices (default 200): one Mosquitto (the baseline) against a
3-node NATS cluster (JetStream R3, MQTT gateway on each node), and the NATS cluster with the node every client is
connected to killed (SIGKILL) when the second wave starts. All three run in this one invocation, so the ratios
compare runs on the same machine under the same load.

Each run: the simulator starts N real DeviceAgents (own MQTT client and state each, two hardware classes), waits
until every retained status is on the broker ("startup_s"), then `run_rollout` rolls a tiny model out (canary 1,
waves of 25 %) and returns when every device reported a terminal result ("converge_s").

    .venv/bin/python bench/bench_nats_converge.py [--devices 200] [--only mosquitto,nats,nats-kill] [--json]
Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
RUNS = ("mosquitto", "nats", "nats-kill")


def one(kind: str, devices: int, tmp: Path) -> dict:
    from brokers import Mosquitto, NatsCluster
    from nats_rollout import rollout_once

    if kind == "mosquitto":
        with Mosquitto(tmp / "mq") as broker:
            run = rollout_once(broker.url, tmp, devices)
    else:
        with NatsCluster(tmp / "nats") as cluster:
            kill = (lambda: cluster.kill(0)) if kind == "nats-kill" else None
            run = rollout_once(cluster.url, tmp, devices, kill=kill)
    committed = sum(1 for m in run["models"].values() if (m.get("version"), m.get("state")) == ("2", "committed"))
    return {
        "broker": kind,
        "devices": devices,
        "state": run["summary"]["state"],
        "counts": run["summary"]["counts"],
        "committed_on_device": committed,
        "startup_s": run["startup_s"],
        "converge_s": run["converge_s"],
        "killed": run["killed"] or None,
    }


def main(argv=None) -> dict:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", type=int, default=200)
    ap.add_argument("--only", default=",".join(RUNS), help="comma-separated subset of " + ", ".join(RUNS))
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args(argv)
    kinds = [k for k in args.only.split(",") if k]
    if not kinds or any(k not in RUNS for k in kinds):
        ap.error(f"--only: choose from {', '.join(RUNS)}")
    runs = []
    for kind in kinds:
        runs.append(one(kind, args.devices, Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))))
        if not args.json:
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    base = next((r for r in runs if r["broker"] == "mosquitto"), None)
    for r in runs:  # ratios against the baseline measured in this same invocation
        r["converge_vs_mosquitto"] = round(r["converge_s"] / base["converge_s"], 2) if base else "not measured"
        r["startup_vs_mosquitto"] = round(r["startup_s"] / base["startup_s"], 2) if base else "not measured"
    doc = {"devices": args.devices, "runs": runs}
    print(json.dumps(doc, indent=None if args.json else 2))
    return doc


if __name__ == "__main__":
    main()
