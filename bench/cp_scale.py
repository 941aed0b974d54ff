#!/usr/bin/env python3
"""The control plane at 1,000 and 10,000 light devices (issue 38), on PostgreSQL, each figure with its growth ratio.

    .venv/bin/python bench/cp_scale.py [--devices 1000,10000] [--samples 200]

For each fleet size: a fresh PostgreSQL database, `edge-agent control-plane --config` in its own process (its CPU
read from /proc), a private Mosquitto, and a light fleet (agent.sim.light, `fleet simulate --light`) in this
process. Measured, in this order:
  enroll       service CPU per enrollment (each device's signed request through POST /api/v1/enroll, 8 at a
               time, accepted by an enrollment token)
  ingest       service CPU per status (each device's signed retained status, until every one is kept)
  overview     GET / (the dashboard overview, bearer token) and GET /api/v1/overview: p50 ms
  list         GET /api/v1/devices?limit=50&offset=RANDOM and GET /devices?page=RANDOM: p99 ms
               (both right after the statuses were kept, again once autovacuum processed the devices table
               (the bench's server checks every 10 s; migration 0003 sets the table's thresholds), and after the
               rollout)
  decisions    signed decision records posted by 8 threads for distinct devices: records/s, and the service's
               CPU per record (1000 / that = records/s one free core would take)
  rollout      canary 1 %, waves of 25 %: for each wave, the seconds from its last device's commit report to the
               next wave's first desired state (the last wave: to the rollout's end), and the convergence time
               (rollout created -> last commit report)
The light fleet and the client share this host's cores with the service: the rates are this machine's, not the
service's ceiling. Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

TICKS = os.sysconf("SC_CLK_TCK")


def cpu_s(pid: int) -> float:
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICKS


def pct(values: list[float], q: float) -> float:
    values = sorted(values)
    return values[min(len(values) - 1, int(q * len(values)))]


def timed_gets(client, paths: list[str]) -> list[float]:
    out = []
    for p in paths:
        t = time.perf_counter()
        r = client.get(p)
        out.append((time.perf_counter() - t) * 1000)
        assert r.status_code == 200, (p, r.status_code, r.text[:200])
    return out


def wait(what: str, check, timeout: float, every: float = 0.2):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        got = check()
        if got:
            return got
        time.sleep(every)
    raise SystemExit(f"bench: timed out waiting for {what}")


def start_service(tmp: Path, db_url: str, broker_url: str, signing_key: Path) -> tuple[subprocess.Popen, str, str]:
    import httpx
    import yaml
    from brokers import free_port

    port = free_port()
    cfg = tmp / "control-plane.yaml"
    limits = {"address_burst": 10**6, "address_per_minute": 1e9, "key_burst": 10**4, "key_per_minute": 1e9}
    doc = {"listen": {"host": "127.0.0.1", "port": port}, "store": "store", "signing_key": str(signing_key),
           "mqtt": {"url": broker_url}, "tick_s": 0.2, "database": {"url": db_url}, "limits": limits}  # fmt: skip
    cfg.write_text(yaml.safe_dump(doc))
    log = (tmp / "cp.log").open("ab")
    proc = subprocess.Popen([sys.executable, "-m", "agent", "control-plane", "--config", str(cfg)], cwd=ROOT,
                            stdout=log, stderr=subprocess.STDOUT)  # fmt: skip
    url = f"http://127.0.0.1:{port}"

    def up():
        if proc.poll() is not None:
            raise SystemExit(f"control plane exited: {(tmp / 'cp.log').read_text()[-2000:]}")
        try:
            return httpx.get(url + "/api/v1/health", timeout=2).status_code == 200
        except httpx.HTTPError:
            return False

    wait("the control plane", up, 120)
    return proc, url, (tmp / "admin.token").read_text().strip()


def autovacuum_every(base: str, seconds: int) -> None:
    from sqlalchemy import create_engine, text

    engine = create_engine(base.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f"ALTER SYSTEM SET autovacuum_naptime = '{int(seconds)}s'"))
        conn.execute(text("SELECT pg_reload_conf()"))
    engine.dispose()


def new_database(base: str, n: int) -> str:
    from sqlalchemy import create_engine, text

    engine = create_engine(base.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "scale_{n}"'))
    engine.dispose()
    return base.rsplit("/", 1)[0] + f"/scale_{n}"


def kept(db_url: str) -> int:
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        got = conn.execute(text("SELECT count(*) FROM devices WHERE status_ts IS NOT NULL")).scalar()
    engine.dispose()
    return int(got or 0)


def vacuumed_after(db_url: str, since: float, timeout: float = 180.0) -> float:
    """Seconds until autovacuum analysed and vacuumed the devices table after `since` (migration 0003's per-table
    settings; the bench's server checks every 10 s)."""
    from sqlalchemy import create_engine, text

    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    q = text("SELECT extract(epoch FROM last_autovacuum), extract(epoch FROM last_autoanalyze) "
             "FROM pg_stat_user_tables WHERE relname = 'devices'")  # fmt: skip
    t0 = time.time()
    try:
        while time.time() - t0 < timeout:
            with engine.connect() as conn:
                vac, ana = conn.execute(q).one()
            if vac and ana and float(vac) > since and float(ana) > since:
                return round(time.time() - t0, 1)
            time.sleep(1.0)
    finally:
        engine.dispose()
    return -1.0


def pages(url: str, h: dict, n: int, samples: int, out: dict, tag: str = "") -> None:
    import httpx

    with httpx.Client(base_url=url, headers=h, timeout=60) as client:
        timed_gets(client, ["/", "/api/v1/overview"] * 3)  # warm
        out[f"overview_page_p50_ms{tag}"] = round(statistics.median(timed_gets(client, ["/"] * (samples // 4))), 1)
        got = timed_gets(client, ["/api/v1/overview"] * (samples // 4))
        out[f"overview_api_p50_ms{tag}"] = round(statistics.median(got), 1)
        offs = [random.randrange(0, max(1, n - 50)) for _ in range(samples)]
        api = timed_gets(client, [f"/api/v1/devices?limit=50&offset={o}" for o in offs])
        page = timed_gets(client, [f"/devices?page={o // 50}" for o in offs[: samples // 2]])
        out[f"list_api_p99_ms{tag}"], out[f"list_page_p99_ms{tag}"] = (
            round(pct(api, 0.99), 1),
            round(pct(page, 0.99), 1),
        )


def post_decisions(url: str, fleet, count: int) -> float:
    """Signed decision records for distinct devices, 8 threads: records per second."""
    from agent.transport.cpclient import post_decision, signed_document

    devs = list(fleet.devices.values())
    docs = []
    for i in range(count):
        d = devs[i % len(devs)]
        body = {"deployment_id": f"bench-{i}", "model": "bench", "version": "1", "decision": {"results": []}}
        docs.append((d.device_id, signed_document(d.device_id, d.key, body, d.next_seq())))
    parts = [docs[i::8] for i in range(8)]
    t = time.perf_counter()
    threads = [threading.Thread(target=lambda p=p: [post_decision(url, dev, doc) for dev, doc in p]) for p in parts]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    return count / (time.perf_counter() - t)


def rollout(url: str, h: dict, db_url: str, fleet, n: int, tmp: Path) -> dict:
    import httpx
    from sqlalchemy import create_engine, text

    from agent.samples import tiny_model

    r = httpx.put(url + "/api/v1/models/tiny/versions/1", content=tiny_model(1.0).SerializeToString(), headers=h)
    assert r.status_code == 201, r.text
    canary = max(1, n // 100)
    body = {"model": "tiny", "version": "1", "canary": str(canary), "wave_size": "25%", "deadline_s": 1800}
    t0 = time.time()
    assert httpx.post(url + "/api/v1/rollouts", json=body, headers=h).status_code == 202

    def done():
        got = httpx.get(url + "/api/v1/rollouts/tiny-1", headers=h, timeout=30).json()
        return got["phase"] in ("finished", "failed") and got

    end = wait("the rollout", done, 1800, every=0.5)
    engine = create_engine(db_url.replace("postgresql://", "postgresql+psycopg://"))
    with engine.connect() as conn:
        state, finished_at = conn.execute(text("SELECT state, updated_at FROM rollouts")).one()
    engine.dispose()
    state = json.loads(state) if isinstance(state, str) else state
    waves: dict[int, list[str]] = {}
    for dev, d in state["devices"].items():
        waves.setdefault(int(d.get("wave") or 0), []).append(dev)
    rep = fleet.reported
    lat = []
    order = sorted(waves)
    for i, w in enumerate(order):
        last = max(rep.get((d, "tiny", "1"), {}).get("committed", 0) for d in waves[w])
        nxt = (min(rep.get((d, "tiny", "1"), {}).get("desired", 1e18) for d in waves[order[i + 1]])
               if i + 1 < len(order) else finished_at)  # fmt: skip
        lat.append(round(nxt - last, 2))
    commits = [v.get("committed", 0) for k, v in rep.items() if k[1:] == ("tiny", "1")]
    return {"state": end["state"], "succeeded": end["progress"]["counts"].get("succeeded"),
            "waves": [len(waves[w]) for w in order], "decided_after_wave_s": lat,
            "converged_s": round(max(commits) - t0, 1)}  # fmt: skip


def one_size(n: int, pg_base: str, broker, tmp: Path, samples: int) -> dict:
    import httpx

    from agent.artifacts.keys import generate
    from agent.sim.light import LightFleet, LightOptions
    from agent.transport.mqtt import BrokerConfig

    key, pub, _ = generate(tmp / "fleet-keys")
    db_url = new_database(pg_base, n)
    proc, url, token = start_service(tmp, db_url, broker.url, key)
    h = {"Authorization": f"Bearer {token}"}
    out: dict = {"devices": n}
    try:
        grant = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "bench", "uses": n}, headers=h).json()
        opts = LightOptions(id_prefix=f"l{n}", control_plane=url, enroll_token=grant["token"], probation_s=2.0,
                            clients=4, workers=32)  # fmt: skip
        fleet = LightFleet(n, BrokerConfig(broker.url), [str(pub)], opts)
        c0, t0 = cpu_s(proc.pid), time.perf_counter()
        fleet.enroll()
        c1, t1 = cpu_s(proc.pid), time.perf_counter()
        out["enroll_cpu_ms"] = round((c1 - c0) / n * 1000, 2)
        out["enroll_per_s"] = round(n / (t1 - t0), 1)
        fleet.start(enroll=False)
        wait("every status kept", lambda: kept(db_url) >= n, 900, every=0.5)
        c2, t2 = cpu_s(proc.pid), time.perf_counter()
        out["ingest_cpu_ms"] = round((c2 - c1) / n * 1000, 2)
        out["ingest_s"] = round(t2 - t1, 1)
        pages(url, h, n, samples, out, "_before_autovacuum")
        out["autovacuum_wait_s"] = vacuumed_after(db_url, time.time() - (time.perf_counter() - t2))
        pages(url, h, n, samples, out)
        c3 = cpu_s(proc.pid)
        count = min(n, 2000)
        out["decisions_per_s"] = round(post_decisions(url, fleet, count), 1)
        out["decision_cpu_ms"] = round((cpu_s(proc.pid) - c3) / count * 1000, 2)
        out["rollout"] = rollout(url, h, db_url, fleet, n, tmp)
        out["decided_max_s"] = max(out["rollout"]["decided_after_wave_s"])
        out["converged_s"] = out["rollout"]["converged_s"]
        pages(url, h, n, samples // 2, out, "_after_rollout")
        fleet.stop()
    finally:
        proc.terminate()
        proc.wait(60)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--devices", default="1000,10000")
    ap.add_argument("--samples", type=int, default=200)
    args = ap.parse_args()
    from brokers import Mosquitto
    from cp_support import postgres

    sizes = [int(x) for x in args.devices.split(",")]
    results = []
    with tempfile.TemporaryDirectory(prefix="cp-scale-") as td:
        tmp = Path(td)
        with postgres(tmp / "pg") as pg:
            autovacuum_every(pg, 10)
            for n in sizes:
                with Mosquitto(tmp / f"mq-{n}") as broker:
                    (tmp / f"n{n}").mkdir()
                    got = one_size(n, pg, broker, tmp / f"n{n}", args.samples)
                print(json.dumps(got), flush=True)
                results.append(got)
    if len(results) > 1:
        a, b = results[0], results[-1]
        keys = [k for k in a if isinstance(a[k], (int, float)) and k != "devices"]
        ratios = {k: round(b[k] / a[k], 2) if a[k] else None for k in keys}
        print(json.dumps({"growth": f"{b['devices']}/{a['devices']} devices", **ratios}), flush=True)


if __name__ == "__main__":
    main()
