"""A tarpit download source (issue 29 item 6) against a device agent with the default download deadlines: the
manifest lists a plain-http source that answers a valid 206 head and then one byte every --every seconds, then
MQTT. Measures, on the monotonic clock: when the device first connects to the tarpit, when it closes that
connection (abandoned), when v2 commits from MQTT; it infers on the previous version every 50 ms throughout and
counts the answers (1.0: v1, 2.0: v2, anything else or an error: a failure). Then a cancel of a download stuck on
the tarpit alone: the time from `cancel` to the tarpit connection closing and the deployment ending.

    .venv/bin/python bench/bench_tarpit.py [--every 10] [--interval-s 30] [--min-bytes 65536] [--json]
Real Mosquitto, real sockets, the in-process DeviceAgent of the tests (tests/support). Not run by the test suite
(tests/test_download_deadlines.py checks the same outcomes with short deadlines, no wall time).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]


def main() -> None:
    import numpy as np
    from brokers import Mosquitto
    from support.mqtt import ControlPlane
    from support.wait import wait_for
    from test_download_deadlines import Tarpit, _agent, _committed, _dep, _push, _serves, _sources_with

    ap = argparse.ArgumentParser()
    ap.add_argument("--every", type=float, default=10.0, help="seconds between two bytes of the tarpit")
    ap.add_argument("--interval-s", type=float, default=30.0, help="downloads.interval_s (default: the config's)")
    ap.add_argument("--min-bytes", type=int, default=64 * 1024, help="downloads.min_bytes (default: the config's)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    class Timed(Tarpit):
        """The tests' tarpit, with the monotonic time of every connection's end."""

        closed_at: list[float] = []

        def _drip(self, conn) -> None:
            try:
                super()._drip(conn)
            finally:
                self.closed_at.append(time.monotonic())

    limits = {"allow_http": True, "interval_s": args.interval_s, "min_bytes": args.min_bytes}
    with tempfile.TemporaryDirectory() as tmp_s, Mosquitto(Path(tmp_s) / "mosquitto") as broker:
        tmp = Path(tmp_s)
        plane = ControlPlane(tmp / "cp", broker)
        plane.serve()
        tarpit = Timed(every=args.every)
        events: list[dict] = []
        a = _agent(tmp / "a", broker, plane, limits, events.append)
        answers: dict[str, int] = {}
        stop = threading.Event()

        def infer_loop() -> None:
            while not stop.wait(0.05):
                try:
                    got = str(_serves(a))
                except Exception as exc:  # noqa: BLE001 - counted as a failure, named
                    got = f"error {type(exc).__name__}"
                answers[got] = answers.get(got, 0) + 1

        try:
            _push(plane, tmp, "1", lambda cp, pkg: [{"type": "mqtt"}])
            wait_for(lambda: _committed(a, "1"), 120, "v1 committed")
            t = threading.Thread(target=infer_loop, daemon=True)
            t.start()
            t0 = time.monotonic()
            _push(plane, tmp, "2", _sources_with(tarpit))
            wait_for(lambda: tarpit.connections > 0, 60, "the device tries the tarpit")
            t_conn = time.monotonic()
            wait_for(lambda: _committed(a, "2"), 3 * args.interval_s + 120, "v2 committed from MQTT")
            t_commit = time.monotonic()
            wait_for(lambda: tarpit.open == 0, 10, "the tarpit's last connection closed")
            t_abandon = max(tarpit.closed_at)  # the device's last connection to it ended: abandoned
            tarpit_connections = tarpit.connections
            time.sleep(0.5)
            stop.set()
            t.join()
            reason = [e.get("reason") for e in events if e.get("progress") == "source_failed"]
        finally:
            stop.set()
            a.stop()
        # cancel: a download stuck on the tarpit alone, a progress deadline far away
        b = _agent(tmp / "b", broker, plane, {"allow_http": True, "interval_s": 3600, "min_bytes": 1})
        try:
            from agent.samples import sample_tiny_package

            pkg = sample_tiny_package(tmp / "pkg-c", version="7")
            m = plane.manifest(pkg, "tiny", "7", sources=_sources_with(tarpit)(plane, pkg)[:1])
            plane.to_device("tiny", plane.envelope(m))
            opened = tarpit.connections
            wait_for(lambda: tarpit.connections > opened and tarpit.open > 0, 60, "stuck on the tarpit")
            time.sleep(1.0)
            c0 = time.monotonic()
            b.orchestrator.cancel("tiny")
            wait_for(lambda: tarpit.open == 0, 30, "tarpit connection closed after cancel")
            c_closed = time.monotonic()
            wait_for(lambda: _dep(b, "7") is not None and _dep(b, "7").terminal, 30, "cancelled deployment ended")
            c_ended = time.monotonic()
            cancel_reason = _dep(b, "7").reason
        finally:
            b.stop()
            tarpit.close()
            plane.close()
    _ = np  # the agent's inference path uses numpy arrays (support code)
    doc = {
        "tarpit_every_s": args.every,
        "downloads": limits,
        "push_to_first_tarpit_connection_s": round(t_conn - t0, 2),
        "tarpit_connections": tarpit_connections,
        "tarpit_connection_to_abandoned_s": round(t_abandon - t_conn, 2),
        "abandoned_to_v2_committed_s": round(t_commit - t_abandon, 2),
        "abandon_reason": (reason or [None])[0],
        "answers_during_deployment": answers,
        "cancel_to_tarpit_closed_s": round(c_closed - c0, 3),
        "cancel_to_deployment_ended_s": round(c_ended - c0, 3),
        "cancel_reason": cancel_reason,
        "how": "time.monotonic() around waits polled every 0.05-0.1 s (tests/support/wait.py); in-process agent",
        "loadavg": os.getloadavg(),
    }
    print(json.dumps(doc, indent=2) if args.json else json.dumps(doc))


if __name__ == "__main__":
    main()
