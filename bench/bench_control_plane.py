#!/usr/bin/env python3
"""Benchmark the control plane's API with many registered devices, on SQLite and on PostgreSQL, in one run.

    .venv/bin/python bench/bench_control_plane.py [--devices 10000] [--requests 300] [--backends sqlite,postgresql]

For each backend: the devices (accepted, 3 groups, 4 hardware classes, a 1 KB verified status each) are written
through the service's own models, the service is started on a loopback port (uvicorn, one process), and one
client measures over real HTTP:
  list      GET /api/v1/devices?limit=50&offset=RANDOM                    p50 / p99 ms
  filter    GET /api/v1/devices?group=G&target=T&limit=50&offset=RANDOM   p50 / p99 ms
  bytes     database bytes per device (SQLite: file + WAL after a checkpoint; PostgreSQL: pg_total_relation_size
            of the devices and device_groups tables)
PostgreSQL is Debian's server started into a temporary directory (tests/cp_support.py). Not run by the test suite.
"""

from __future__ import annotations

import argparse
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

GROUPS = ("north", "south", "lab")
TARGETS = ("raspberry-pi-5", "jetson-orin", "generic-x86_64", "qualcomm-qcs6490")


def _status(dev: str, target: str) -> dict:
    return {
        "device_id": dev,
        "online": True,
        "ts": time.time(),
        "agent_version": "0.1.0",
        "target": target,
        "hardware": {"arch": "aarch64", "board": "Raspberry Pi 5 Model B Rev 1.0", "accelerators": []},
        "providers": ["cpu"],
        "providers_source": "probed",
        "models": {
            "resnet": {"version": "3", "sha256": "a" * 64, "provider": "cpu", "precision": "f32", "state": "committed"}
        },
        "deployments": {
            "resnet": {
                "id": "d" * 32,
                "version": "3",
                "state": "committed",
                "result": "committed",
                "reason": None,
                "swap": "make-before-break",
                "ts": time.time(),
            }
        },
        "trust": "verified",
    }


def populate(cp, n: int) -> None:
    from agent.controlplane.db import write
    from agent.controlplane.models import Device, DeviceGroup

    now = time.time()
    batch = 1000
    for start in range(0, n, batch):
        with write(cp.factory) as s:
            devices, groups = [], []
            for i in range(start, min(n, start + batch)):
                dev, target, group = f"dev-{i:06d}", TARGETS[i % len(TARGETS)], GROUPS[i % len(GROUPS)]
                devices.append(
                    dict(
                        device_id=dev,
                        state="accepted",
                        public_key="-----BEGIN PUBLIC KEY-----\nMCowBQYDK2VwAyEA"
                        + f"{i:032d}"
                        + "=\n-----END PUBLIC KEY-----\n",
                        key_id=f"{i:016x}",
                        groups=[group],
                        target=target,
                        provider="cpu",
                        online=True,
                        hardware={"arch": "aarch64"},
                        status=_status(dev, target),
                        status_ts=now,
                        requested_at=now,
                        decided_at=now,
                        decided_by="bench",
                    )
                )
                groups.append(dict(device_id=dev, group=group))
            s.execute(Device.__table__.insert(), devices)
            s.execute(
                DeviceGroup.__table__.insert(),
                [{"device_id": g["device_id"], "group_name": g["group"]} for g in groups],
            )


def db_bytes(cp, url: str) -> int:
    from sqlalchemy import text

    with cp.engine.connect() as conn:
        if url.startswith("sqlite"):
            conn.execute(text("PRAGMA wal_checkpoint(TRUNCATE)"))
            path = Path(url[len("sqlite:///") :])
            return sum(p.stat().st_size for p in path.parent.glob(path.name + "*"))
        return int(
            conn.execute(
                text("SELECT pg_total_relation_size('devices') + pg_total_relation_size('device_groups')")
            ).scalar()
            or 0
        )


def measure(base: str, token: str, n: int, requests: int) -> dict:
    import httpx

    rnd = random.Random(1)
    out = {}
    with httpx.Client(base_url=base, headers={"Authorization": f"Bearer {token}"}, timeout=60) as c:
        for name, params in (("list", {}), ("filter", {"group": "lab", "target": "jetson-orin"})):
            c.get("/api/v1/devices", params={**params, "limit": 50})  # warm
            times = []
            total = c.get("/api/v1/devices", params={**params, "limit": 1}).json()["total"]
            for _ in range(requests):
                q = {**params, "limit": 50, "offset": rnd.randrange(0, max(1, total - 50))}
                t0 = time.perf_counter()
                r = c.get("/api/v1/devices", params=q)
                times.append((time.perf_counter() - t0) * 1000)
                assert r.status_code == 200 and len(r.json()["devices"]) == 50, r.text[:200]
            times.sort()
            out[name] = {
                "p50_ms": statistics.median(times),
                "p99_ms": times[int(0.99 * (len(times) - 1))],
                "matching": total,
            }
    return out


def run_backend(url: str, tmp: Path, n: int, requests: int) -> dict:
    from brokers import free_port

    from agent.controlplane.service import ControlPlane, server
    from agent.controlplane.settings import parse

    port = free_port()
    cp = ControlPlane(
        parse({"store": str(tmp / "store"), "listen": {"port": port}, "database": {"url": url}}, tmp)
    ).prepare()
    t0 = time.perf_counter()
    populate(cp, n)
    load_s = time.perf_counter() - t0
    srv = server(cp)
    th = threading.Thread(target=srv.run, daemon=True)
    th.start()
    while not srv.started:
        time.sleep(0.05)
    try:
        res = measure(f"http://127.0.0.1:{port}", cp.admin_token or "", n, requests)
    finally:
        srv.should_exit = True
        th.join(timeout=30)
    res["bytes_per_device"] = db_bytes(cp, url) / n
    res["load_s"] = load_s
    cp.stop()
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--devices", type=int, default=10000)
    ap.add_argument("--requests", type=int, default=300)
    ap.add_argument("--backends", default="sqlite,postgresql")
    args = ap.parse_args()
    print(f"control plane API with {args.devices} registered devices, {args.requests} requests per figure, one client")
    for backend in args.backends.split(","):
        with tempfile.TemporaryDirectory(prefix="cp-bench-") as d:
            tmp = Path(d)
            if backend == "sqlite":
                res = run_backend(f"sqlite:///{tmp / 'cp.db'}", tmp, args.devices, args.requests)
            else:
                from cp_support import postgres

                with postgres(tmp / "pg") as url:
                    res = run_backend(url, tmp, args.devices, args.requests)
        for name in ("list", "filter"):
            r = res[name]
            print(
                f"{backend:<11} {name:<7} p50 {r['p50_ms']:7.2f} ms  p99 {r['p99_ms']:7.2f} ms  ({r['matching']} matching devices, pages of 50)"
            )
        print(
            f"{backend:<11} bytes   {res['bytes_per_device']:.0f} database bytes per device (1 KB status each); "
            f"loading took {res['load_s']:.1f} s"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
