"""Start-to-converge of one rollout to N simulated devices (default 200): one Mosquitto (the baseline) against a
3-node NATS cluster (JetStream R3, MQTT gateway on each node), and the NATS cluster with the node every client is
connected to killed (SIGKILL) when the second wave starts. All three run in this one invocation, so the ratios
compare runs on the same machine under the same load.

Each run: the simulator starts N real DeviceAgents (own MQTT client and state each, two hardware classes), waits
until every retained status is on the broker ("startup_s"), then `run_rollout` rolls a tiny model out (canary 1,
waves of 25 %) and returns when every device reported a terminal result ("converge_s"). "peak_fds" and
"highest_fd": the most descriptors this process held open and the highest descriptor number seen (sampled from
/proc/self/fd every 0.5 s; "not measured" elsewhere): past 1024, a select()-based MQTT loop cannot connect.

    .venv/bin/python bench/bench_nats_converge.py [--devices 200] [--only mosquitto,nats,nats-kill] [--json]
Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "tests"))
RUNS = ("mosquitto", "nats", "nats-kill")


class FdSampler:
    """The peak count and highest number of this process's open descriptors, sampled in a thread."""

    def __init__(self, every_s: float = 0.5):
        self.every_s, self.peak, self.highest = every_s, 0, -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="fd-sampler", daemon=True)

    def _run(self) -> None:
        while True:
            try:
                fds = [int(n) for n in os.listdir("/proc/self/fd")]
            except OSError:
                return  # no /proc: stays "not measured"
            self.peak, self.highest = max(self.peak, len(fds)), max(self.highest, *fds)
            if self._stop.wait(self.every_s):
                return

    def __enter__(self) -> "FdSampler":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(5)

    def figures(self) -> dict:
        if self.highest < 0:
            return {"peak_fds": "not measured", "highest_fd": "not measured"}
        return {"peak_fds": self.peak, "highest_fd": self.highest}


def one(kind: str, devices: int, tmp: Path) -> dict:
    from brokers import Mosquitto, NatsCluster
    from nats_rollout import rollout_once

    with FdSampler() as fds:
        try:
            if kind == "mosquitto":
                with Mosquitto(tmp / "mq") as broker:
                    run = rollout_once(broker.url, tmp, devices)
            else:
                with NatsCluster(tmp / "nats") as cluster:
                    kill = (lambda: cluster.kill(0)) if kind == "nats-kill" else None
                    run = rollout_once(cluster.url, tmp, devices, kill=kill)
        except Exception as exc:  # noqa: BLE001 - a run that did not finish is a row that says why
            return {
                "broker": kind,
                "devices": devices,
                "state": "error",
                "error": f"{type(exc).__name__}: {exc}"[:3000],
                **fds.figures(),
                "loadavg_1m": _loadavg(),
            }
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
        **fds.figures(),
        "loadavg_1m": _loadavg(),
    }


def _loadavg() -> float | str:
    try:
        return round(os.getloadavg()[0], 1)  # at the end of the run
    except OSError:
        return "not measured"


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
        tmp = Path(tempfile.mkdtemp(prefix=f"bench-{kind}-"))
        try:
            runs.append(one(kind, args.devices, tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)  # 200 devices' state directories and a JetStream store each
        if not args.json:
            print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
    base = next((r for r in runs if r["broker"] == "mosquitto" and "converge_s" in r), None)
    for r in runs:  # ratios against the baseline measured in this same invocation
        for key in ("converge", "startup"):
            ok = base is not None and f"{key}_s" in r
            r[f"{key}_vs_mosquitto"] = round(r[f"{key}_s"] / base[f"{key}_s"], 2) if ok else "not measured"
    doc = {"devices": args.devices, "runs": runs}
    print(json.dumps(doc, indent=None if args.json else 2))
    return doc


if __name__ == "__main__":
    main()
