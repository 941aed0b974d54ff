"""The control plane's whole-fleet paths (issue 38), against the real service on SQLite and a real PostgreSQL:
the overview's counts come from SQL over the indexed columns and equal a recount over the status documents
in Python, and neither the overview page nor a device list page runs a statement that reads a status document;
the overview's kept counts (fleet_counts) equal a GROUP BY over the devices after every kind of change; the API's
and the dashboard's device lists paged by cursor list each device once while devices enroll between pages;
a light fleet (agent.sim.light) of 200 devices on a real Mosquitto enrolls through the API while the fleet loop
runs (no registry reload, each status verified once) and converges on a canary-then-waves rollout."""

from __future__ import annotations

import json
import re

import httpx
from brokers import Mosquitto
from cp_support import running_service
from sqlalchemy import event, func, select
from support.wait import wait_for

from agent.artifacts.keys import device_key, generate
from agent.controlplane.models import Device
from agent.transport.cpclient import enroll

READS_STATUS = re.compile(r"\bdevices\.status\b(?!_)", re.IGNORECASE)  # the status document column


def _status(i: int) -> dict:
    """A mixed fleet: 3 targets, 2 providers, 2 precisions, 3 version sets, some on probation, some offline."""
    models = {"det": {"version": str(1 + i % 3), "provider": ["CPU", "OpenVINO"][i % 2],
                      "precision": ["fp32", "int8"][i % 4 // 2], "state": "probation" if i % 5 == 0 else "committed"}}  # fmt: skip
    if i % 7 == 0:
        models["cls"] = {"version": "4", "provider": "CPU", "precision": "fp16", "state": "committed"}
    if i % 11 == 0:
        models = {}
    return {"trust": "verified", "online": i % 6 != 0, "ts": 100.0 + i, "target": f"t{i % 3}", "models": models,
            "providers": ["CPU"]}  # fmt: skip


def _recount(docs: list[dict]) -> dict:
    cohorts: dict[tuple, list[int]] = {}
    for d in docs:
        models = d["models"]
        serving = [m["provider"] for m in models.values()]
        provider = (serving or d["providers"])[0]
        precision = ", ".join(sorted({m["precision"] for m in models.values()})) or "none"
        versions = ", ".join(f"{m} {v['version']}" for m, v in sorted(models.items())) or "none"
        c = cohorts.setdefault((d["target"], provider, precision, versions), [0, 0])
        c[0] += 1
        c[1] += int(d["online"])
    return {k: tuple(v) for k, v in cohorts.items()}


def test_overview_counts_come_from_sql_and_no_page_reads_a_status(tmp_path, db_url):
    from agent.controlplane.fleetloop import FleetLoop

    with running_service(tmp_path, database={"url": db_url}) as (cp, url):
        h = {"Authorization": f"Bearer {cp.admin_token}"}
        token = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "t", "uses": 60}, headers=h).json()["token"]
        ids = [f"mix-{i}" for i in range(60)]
        for dev in ids:
            assert enroll(url, dev, device_key(tmp_path / "keys" / dev), token=token)["state"] == "accepted"
        docs = {dev: _status(i) for i, dev in enumerate(ids)}
        FleetLoop(cp.factory, cp.settings)._ingest(docs)
        ov = httpx.get(url + "/api/v1/overview", headers=h).json()
        got = {(c["target"], c["provider"], c["precision"], c["models"]): (c["devices"], c["online"])
               for c in ov["cohorts"]}  # fmt: skip
        assert got == _recount(list(docs.values())) and ov["states"] == {"accepted": 60}
        states = ov["by"]["model_state"]
        assert sum(states.values()) == 60 and states["none"] == sum(1 for d in docs.values() if not d["models"])
        statements: list[str] = []
        event.listen(cp.engine, "before_cursor_execute", lambda c, cur, stmt, *a: statements.append(stmt))
        for path in ("/", "/devices", "/devices?page=1"):
            assert httpx.get(url + path, headers=h).status_code == 200
        listed = httpx.get(url + "/api/v1/devices?limit=25&offset=25", headers=h).json()
        assert listed["total"] == 60 and len(listed["devices"]) == 25
        assert listed["devices"][0]["models"]["det"]["version"] in ("1", "2", "3")
        assert httpx.get(url + "/api/v1/overview", headers=h).status_code == 200
        assert statements and [s for s in statements if "devices" in s]
        assert not [s for s in statements if READS_STATUS.search(s)], [s for s in statements if READS_STATUS.search(s)]
        statements.clear()
        assert httpx.get(url + "/api/v1/devices/mix-1", headers=h).json()["status"]["target"] == "t1"
        assert [s for s in statements if READS_STATUS.search(s)]  # the pattern does catch a read of the document


def test_the_kept_counts_follow_every_change_of_a_device(tmp_path, db_url):
    """fleet_counts (agent.controlplane.fleetcounts) equals a GROUP BY over the devices table after each kind of
    change: enrollment (accepted and pending), statuses kept and changed, accept, reject, decommission, delete."""
    from agent.controlplane import fleetcounts
    from agent.controlplane.fleetloop import FleetLoop

    with running_service(tmp_path, database={"url": db_url}) as (cp, url):
        h = {"Authorization": f"Bearer {cp.admin_token}"}

        def same() -> dict:
            with cp.factory() as s:
                kept, recount = fleetcounts.kept(s), fleetcounts.recount(s)
            assert kept == recount
            return kept

        token = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "t", "uses": 12}, headers=h).json()["token"]
        ids = [f"cnt-{i}" for i in range(12)]
        for dev in ids:
            enroll(url, dev, device_key(tmp_path / "keys" / dev), token=token)
        for dev in ("wait-0", "wait-1", "wait-2"):
            assert enroll(url, dev, device_key(tmp_path / "keys" / dev))["state"] == "pending"
        assert sum(same().values()) == 15
        loop = FleetLoop(cp.factory, cp.settings)
        loop._ingest({dev: _status(i) for i, dev in enumerate(ids)})
        assert len(same()) > 3  # several cohorts
        loop._ingest({dev: _status(i + 1) for i, dev in enumerate(ids[:6])})  # half of them changed
        loop._ingest({dev: _status(i + 1) for i, dev in enumerate(ids[:6])})  # the same again: nothing changes
        same()
        for path in ("/api/v1/devices/wait-0/accept", "/api/v1/devices/wait-1/reject", "/api/v1/devices/cnt-3/decommission"):  # fmt: skip
            assert httpx.post(url + path, headers=h).status_code == 200, path
        assert httpx.delete(url + "/api/v1/devices/cnt-4", headers=h).status_code == 200
        kept = same()
        ov = httpx.get(url + "/api/v1/overview", headers=h).json()
        assert ov["states"] == {"accepted": 11, "pending": 1, "rejected": 1, "decommissioned": 1}
        assert sum(c["devices"] for c in ov["cohorts"]) == 11 == sum(n for k, n in kept.items() if k[0] == "accepted")


def test_keyset_pages_list_each_device_once_while_devices_enroll(tmp_path, db_url, monkeypatch):
    """The API's and the dashboard's device lists paged by `after` cursors while devices enroll between pages, some
    sorting before the page reached and some after: every device listed once, none skipped, each one enrolled
    behind the cursor listed too; `offset` pages still answer (and do list a device twice under the same inserts,
    which is why the cursor exists)."""
    from agent.controlplane import webdevices

    monkeypatch.setattr(webdevices, "PAGE", 10)  # the dashboard's page size: 3 pages of the 30 devices below
    limits = {"address_burst": 10**6, "address_per_minute": 1e9}  # enrollments from one address, quickly
    with running_service(tmp_path, database={"url": db_url}, limits=limits) as (cp, url):
        h = {"Authorization": f"Bearer {cp.admin_token}"}
        grant = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "t", "uses": 400}, headers=h).json()
        free = [f"k-{i:03d}" for i in range(1, 400, 2)]  # ids not enrolled yet, between the first ones

        def add(dev: str) -> str:
            assert enroll(url, dev, device_key(tmp_path / "keys" / dev), token=grant["token"])["state"] == "accepted"
            return dev

        first = {add(f"k-{i:03d}") for i in range(0, 60, 2)}  # 30 devices: 4 API pages of 8, 3 dashboard pages

        def enroll_around(last: str) -> set[str]:
            """One device that sorts before the page just listed, one behind it (listed later)."""
            picked = next(d for d in free if d > last)
            free.remove(picked)
            return {add(f"j-{len(free)}"), add(picked)}  # "j-" sorts before every "k-"

        seen: list[str] = []
        behind: set[str] = set()
        page = httpx.get(url + "/api/v1/devices", params={"limit": 8}, headers=h).json()
        while True:
            seen += [d["device_id"] for d in page["devices"]]
            if page["next"] is None:
                break
            behind |= {d for d in enroll_around(seen[-1]) if d > seen[-1]}
            page = httpx.get(url + "/api/v1/devices", params={"limit": 8, "after": page["next"]}, headers=h).json()
        assert len(seen) == len(set(seen)) and set(seen) >= first | behind and seen == sorted(seen)
        assert httpx.get(url + "/api/v1/devices", params={"after": "junk"}, headers=h).status_code == 400

        shown: list[str] = []
        html = httpx.get(url + "/devices", headers=h).text
        while True:
            table = html.split('id="devices"', 1)[1].split("</table>", 1)[0]
            shown += re.findall(r'<a href="/devices/([jk]-\d+)">', table)
            link = re.search(r'<a class="next" href="\?([^"]+)">', html)
            if link is None:
                break
            assert "after=" in link.group(1)
            enroll_around(shown[-1])
            html = httpx.get(url + "/devices?" + link.group(1).replace("&amp;", "&"), headers=h).text
        listed = httpx.get(url + "/api/v1/devices", params={"limit": 1000}, headers=h).json()
        assert len(shown) == len(set(shown)) and shown == sorted(shown) and len(shown) >= 30
        assert set(shown) >= first and not [d["device_id"] for d in listed["devices"] if d["device_id"] > shown[-1]]

        offsets: list[str] = []  # the old parameter: still served, and not stable under inserts
        for n in range(3):
            got = httpx.get(url + "/api/v1/devices", params={"limit": 8, "offset": 8 * n}, headers=h).json()
            assert got["offset"] == 8 * n and len(got["devices"]) == 8
            offsets += [d["device_id"] for d in got["devices"]]
            enroll_around(offsets[-1])
        assert len(offsets) > len(set(offsets))


def test_a_light_fleet_enrolls_without_a_reload_and_converges_on_a_rollout(tmp_path):
    from agent.samples import tiny_model
    from agent.sim.light import LightFleet, LightOptions
    from agent.transport.mqtt import BrokerConfig

    key, pub, _ = generate(tmp_path / "fleet-keys")
    limits = {"address_burst": 100000, "address_per_minute": 1e6, "key_burst": 1000, "key_per_minute": 1e5}
    with (
        Mosquitto(tmp_path / "mq") as broker,
        running_service(tmp_path, signing_key=str(key), mqtt={"url": broker.url}, tick_s=0.3, limits=limits) as (
            cp,
            url,
        ),
    ):
        h = {"Authorization": f"Bearer {cp.admin_token}"}
        token = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "l", "uses": 200}, headers=h).json()["token"]
        opts = LightOptions(control_plane=url, enroll_token=token, probation_s=0.5, clients=2)
        fleet = LightFleet(200, BrokerConfig(broker.url), [str(pub)], opts)
        try:
            fleet.start()

            def reported() -> bool:
                with cp.factory() as s:
                    return s.scalar(select(func.count()).where(Device.status_ts.isnot(None))) == 200

            wait_for(reported, 120, "200 verified statuses kept")
            watch = cp.loop.link.watch
            assert cp.loop.reloads == 0  # every enrollment put its one entry: the registry was never read whole
            # each status verified once as it came, and once more when it came before the loop put its key (a
            # resubscription per enrollment would verify about 200 * 200 / 2)
            assert watch.verifications <= 2 * 200 + 5, watch.verifications
            onnx = tmp_path / "tiny.onnx"
            onnx.write_bytes(tiny_model(1.0).SerializeToString())
            r = httpx.put(url + "/api/v1/models/tiny/versions/1", content=onnx.read_bytes(), headers=h)
            assert r.status_code == 201, r.text
            body = {"model": "tiny", "version": "1", "canary": "2", "wave_size": "50%", "deadline_s": 300}
            assert httpx.post(url + "/api/v1/rollouts", json=body, headers=h).status_code == 202

            def finished():
                r = httpx.get(url + "/api/v1/rollouts/tiny-1", headers=h).json()
                return r["phase"] == "finished" and r

            done = wait_for(finished, 240, "tiny-1 finished on 200 light devices")
            assert done["state"] == "completed" and done["progress"]["counts"].get("succeeded") == 200, done
            assert fleet.counts["committed"] == 200 and fleet.counts["decisions"] == 200
            assert fleet.counts["failed"] == 0 and fleet.counts["refused"] == 0
            # a device that reported before it asked: its kept status is believed once it is accepted
            late = LightFleet(1, BrokerConfig(broker.url), [str(pub)], LightOptions(id_prefix="late", clients=1))
            late.start()
            wait_for(lambda: "late-1" in watch.status, 30, "the late device's status seen")
            before = watch.verifications
            late.control_plane, late.enroll_token = url, token2(url, h)
            assert late.enroll() == {"accepted": 1}
            with cp.factory() as s:
                wait_for(lambda: (s.expire_all(), s.get(Device, "late-1").status_ts)[1], 30, "the late status kept")
            assert cp.loop.reloads == 0 and watch.verifications - before <= 2, watch.verifications - before
            before = watch.verifications  # a whole reread (no device named) believes again only what changed
            cp.registry_changed()
            wait_for(lambda: cp.loop.reloads == 1, 30, "one whole-registry read")
            assert watch.verifications - before <= 1, watch.verifications - before  # a heartbeat meanwhile: once
            late.stop()
        finally:
            fleet.stop()


def token2(url: str, h: dict) -> str:
    return httpx.post(url + "/api/v1/enroll-tokens", json={"name": "late", "uses": 1}, headers=h).json()["token"]


def test_fleet_simulate_light_from_the_cli(tmp_path):
    """`edge-agent fleet simulate --light --store S`: the devices registered in S/registry.json, their signed
    statuses retained on the broker, stopped by SIGTERM with its counts as JSON."""
    import json as _json
    import signal
    import subprocess

    from clirunner import EXE, ROOT

    from agent.fleet.registry import DeviceRegistry
    from agent.fleet.watch import fleet_status
    from agent.transport.mqtt import BrokerConfig

    _, pub, _ = generate(tmp_path / "fleet-keys")
    with Mosquitto(tmp_path / "mq") as broker:
        cmd = [*EXE, "fleet", "simulate", "--light", "--devices", "30", "--trust", str(pub), "--broker", broker.url,
               "--store", str(tmp_path / "store"), "--clients", "2", "--json"]  # fmt: skip
        proc = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        try:
            started = _json.loads(proc.stdout.readline())
            assert started["event"] == "started" and started["devices"] == 30 and started["clients"] == 2
            registry = DeviceRegistry.load(tmp_path / "store" / "registry.json")
            assert len(registry.devices) == 30
            got = wait_for(
                lambda: (r := fleet_status(BrokerConfig(broker.url), registry=registry))["count"] == 30 and r,
                30,
                "30 retained statuses",
            )
            assert {d["trust"] for d in got["devices"]} == {"verified"}
        finally:
            proc.send_signal(signal.SIGTERM)
            out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        assert _json.loads(out.strip().splitlines()[-1])["event"] == "stopped"


def test_migration_0003_backfills_the_columns_from_stored_statuses(db_url):
    """A database at 0002 with devices that reported: after the upgrade each has its columns, as the intake sets."""
    from alembic import command
    from alembic.config import Config
    from sqlalchemy import text

    from agent.controlplane import cohort
    from agent.controlplane.db import MIGRATIONS, make_engine

    engine = make_engine(db_url)
    cfg = Config()
    cfg.set_main_option("script_location", str(MIGRATIONS))
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "0002_freshness")
    cast = "CAST(:s AS JSON)" if engine.dialect.name == "postgresql" else ":s"
    docs = {f"old-{i}": _status(i) for i in range(12)}
    with engine.begin() as conn:
        for dev, doc in [*docs.items(), ("never", None)]:
            conn.execute(
                text(
                    "INSERT INTO devices (device_id, state, public_key, groups, online, hardware, status, requested_at)"
                    f" VALUES (:d, 'accepted', 'k', '[]', true, '{{}}', {cast}, 1.0)"
                ),
                {"d": dev, "s": None if doc is None else json.dumps(doc)},
            )
    with engine.begin() as conn:
        cfg.attributes["connection"] = conn
        command.upgrade(cfg, "head")
    with engine.connect() as conn:
        rows = {
            r[0]: r[1:]
            for r in conn.execute(text("SELECT device_id, precision, model_versions, model_state FROM devices"))
        }
    with engine.begin() as conn:  # and back down, and up again
        cfg.attributes["connection"] = conn
        command.downgrade(cfg, "0002_freshness")
        command.upgrade(cfg, "head")
    engine.dispose()
    with engine.connect() as conn:
        counted = conn.execute(
            text("SELECT state, online, sum(devices) FROM fleet_counts GROUP BY state, online")
        ).all()
    assert [(st, bool(on), int(n)) for st, on, n in counted] == [("accepted", True, 13)]  # the migration's count
    want = {dev: tuple(cohort.columns(doc).values()) for dev, doc in docs.items()}
    assert {d: r for d, r in rows.items() if d != "never"} == want and rows["never"] == (None, None, None)
    assert {r[1] for r in want.values()} >= {"det 2", "cls 4, det 2", "none"}  # one model, two, none


def test_the_leader_counts_accepted_devices_only_after_the_audit_log_moved(tmp_path):
    """A device accepted on another replica reaches the leader's registry through the database alone; the leader
    reads the audit log's last id every turn and counts the accepted devices only once that moved: idle turns run
    no count, the accept (written here as another replica would, without telling this one) runs one."""
    from agent.artifacts.keys import public_pem
    from agent.controlplane import db
    from agent.controlplane.enroll import preregister

    with Mosquitto(tmp_path / "mq") as broker, running_service(tmp_path, mqtt={"url": broker.url}) as (cp, _):
        statements: list[str] = []
        event.listen(cp.engine, "before_cursor_execute", lambda c, cur, stmt, *a: statements.append(stmt))

        def looks() -> int:
            return sum("max(audit_log.id)" in s for s in statements)

        def counts() -> int:
            return sum("max(devices.decided_at)" in s for s in statements)

        wait_for(lambda: looks() >= 1, 30, "a turn of the leader")  # its first count is behind it
        statements.clear()
        wait_for(lambda: looks() >= 4, 60, "four more turns of the leader")
        assert counts() <= 1, [s for s in statements if "devices" in s]  # at most the recount every RECOUNT_S
        pem = public_pem(device_key(tmp_path / "keys" / "other-1").public_key())
        with db.write(cp.factory) as session:
            preregister(session, "other-1", pem, ["lab"], "operator:elsewhere")
        wait_for(lambda: "other-1" in cp.loop.registry.devices, 30, "the device in the leader's registry")
        assert counts() >= 1 and cp.loop.reloads == 0  # counted, and just that device's entry put
