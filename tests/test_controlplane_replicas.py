"""Two `edge-agent control-plane` processes on one PostgreSQL: either answers the API and the dashboard (a sign-in
on one works on the other; rate limits are shared), one leads the rollouts and the MQTT fan-out by a lease with a
fencing token. The leader SIGKILLed mid-rollout: the other takes over within 10 s, the rollout finishes, no device
receives its desired state twice (counted by a subscriber on the broker), and the survivor answered throughout.
Fencing on the database: a stale leader's write is refused. Replicas with stores of their own and one shared
`uploads_dir`: a package uploaded through the standby is planned and served by the leader."""

from __future__ import annotations

import hashlib
import json
import re
import signal
import threading
import time
from collections import Counter
from pathlib import Path

import httpx
import pytest
import yaml
from brokers import Mosquitto, free_port
from clirunner import edge_agent
from cp_support import cp_health, start_cp
from support.stop import stop
from support.wait import wait_for

from agent import sysroots
from agent.artifacts.keys import generate
from agent.samples import tiny_model, write_package
from agent.sim.simulator import Simulator
from agent.transport.mqtt import BrokerConfig, MqttLink

WAIT_S = 240.0
pytestmark = [pytest.mark.timeout(900)]


@pytest.fixture
def pg(tmp_path):
    from cp_support import postgres

    with postgres(tmp_path / "pg") as url:
        yield url


def _engine(url: str):
    from agent.controlplane import db

    engine = db.make_engine(url)
    db.migrate(engine)
    return engine


def test_a_stale_leaders_write_is_refused(pg):
    from sqlalchemy import update

    from agent.controlplane.db import write
    from agent.controlplane.lease import Lease, LeaseLost
    from agent.controlplane.models import Rollout
    from agent.controlplane.shared_models import LeaderLease

    engine = _engine(pg)
    try:
        a, b = Lease(engine, 5.0, holder="replica-a"), Lease(engine, 5.0, holder="replica-b")
        assert a.try_acquire() and a.fence == 1
        assert not b.try_acquire() and b.fence is None  # held, not expired: no second leader
        fenced = a.fenced_sessions()
        row = {"spec": {}, "knobs": {}, "phase": "running", "created_by": "t", "created_at": 0.0, "updated_at": 0.0}
        with write(fenced) as s:  # the leader writes while it holds the lease
            s.add(Rollout(rollout_id="r-1", **row))
        with write(a.factory) as s:  # a's lease runs out (as when a stops renewing: paused, cut off, killed)
            s.execute(update(LeaderLease).values(expires_at=0.0))
        assert b.try_acquire() and b.fence == 2  # taken over with a new fence
        with pytest.raises(LeaseLost, match="stale"):
            with write(fenced) as s:  # a, not knowing yet, writes: refused, nothing kept
                s.add(Rollout(rollout_id="r-2", **row))
        with a.factory() as s:
            assert s.get(Rollout, "r-2") is None and s.get(Rollout, "r-1") is not None
        assert not a.try_acquire() and a.fence is None  # a learns it lost the lease at its next renewal
        with write(b.fenced_sessions()) as s:  # the new leader's write goes through
            s.add(Rollout(rollout_id="r-3", **row))
        b.release()
        assert a.try_acquire() and a.fence == 3  # a clean stop hands over at once
    finally:
        engine.dispose()


def test_sessions_and_rate_limits_are_shared_through_the_database(pg):
    from agent.controlplane import db
    from agent.controlplane.ratelimit import DbLimiter
    from agent.controlplane.sessions import Sessions

    e1, e2 = _engine(pg), _engine(pg)  # two replicas' engines
    try:
        one, two = Sessions(db.sessions(e1)), Sessions(db.sessions(e2))
        made = one.create("ab" * 32)
        seen = two.get(made.sid)
        assert seen is not None and seen.csrf == made.csrf and seen.token_hash == "ab" * 32
        seen.set_flash("halted")
        again = one.get(made.sid)
        assert again is not None and again.pop_flash() == "halted"
        assert one.get(made.sid).flash is None  # popped once, for every replica
        two.drop(made.sid)
        assert one.get(made.sid) is None
        l1, l2 = DbLimiter(db.sessions(e1)), DbLimiter(db.sessions(e2))
        assert l1.take("addr:10.0.0.1", 60.0, 2) == 0.0
        assert l2.take("addr:10.0.0.1", 60.0, 2) == 0.0
        assert l1.take("addr:10.0.0.1", 60.0, 2) > 0.0  # the burst of 2 spent across both replicas
        assert l2.take("addr:10.0.0.2", 60.0, 2) == 0.0  # another address has its own bucket
    finally:
        e1.dispose()
        e2.dispose()


def test_two_rate_buckets_taken_in_one_statement_keep_their_order(pg):
    """A device's post takes its address's bucket, then the device's (DbLimiter.take_all, one statement): a
    refused address takes nothing from the device; a refused device has spent the address's token (as two takes
    one after the other would), and the wait is the refused bucket's own."""
    from agent.controlplane import db
    from agent.controlplane.ratelimit import DbLimiter

    engine = _engine(pg)
    try:
        lim, clock = DbLimiter(db.sessions(engine)), [1000.0]
        lim.clock = lambda: clock[0]
        assert lim.take_all([("addr:a", 60.0, 1), ("key:d", 60.0, 5)]) == (-1, 0.0)
        i, wait = lim.take_all([("addr:a", 60.0, 1), ("key:d", 60.0, 5)])
        assert i == 0 and wait == pytest.approx(1.0)  # the address's burst of 1 is spent: 1 s to its next token
        assert [lim.take("key:d", 60.0, 5) for _ in range(5)][:4] == [0.0] * 4  # 4 left: the refusal took none
        assert lim.take("key:d", 60.0, 5) > 0.0
        assert lim.take_all([("addr:b", 60.0, 10), ("key:e", 6.0, 1)]) == (-1, 0.0)
        i, wait = lim.take_all([("addr:b", 60.0, 10), ("key:e", 6.0, 1)])
        assert i == 1 and wait == pytest.approx(10.0)  # the device's bucket: one token per 10 s
        assert [lim.take("addr:b", 60.0, 10) for _ in range(9)] == [0.0] * 8 + [pytest.approx(1.0)]  # 2 spent
        clock[0] += 10.0  # the device's token is back (and the address refilled)
        assert lim.take_all([("addr:b", 60.0, 10), ("key:e", 6.0, 1)]) == (-1, 0.0)
        lim.close()
    finally:
        engine.dispose()


def test_replicas_starting_at_once_migrate_once_and_make_one_admin_token(pg, tmp_path):
    from agent.controlplane.service import ControlPlane
    from agent.controlplane.settings import parse

    errors: list[str] = []
    made: list = []

    def start(i: int) -> None:
        try:
            doc = {
                "store": str(tmp_path / "store"),
                "database": {"url": pg},
                "admin_token_file": str(tmp_path / f"a{i}"),
            }
            made.append(ControlPlane(parse(doc, tmp_path)).prepare())
        except Exception as exc:  # noqa: BLE001 - each replica's failure is the finding
            errors.append(repr(exc))

    threads = [threading.Thread(target=start, args=(i,)) for i in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)  # without the advisory locks, concurrent migrations can wait on each other for ever
    try:
        assert not any(t.is_alive() for t in threads), "a replica's start hung"
        assert errors == [] and len(made) == 3, errors
        assert sum(1 for c in made if c.admin_token) == 1  # one first start, whichever won
    finally:
        for c in made:
            c.stop()


# -- two replicas as processes ---------------------------------------------------------------------------------
def _config(
    path: Path, port: int, db_url: str, broker: str, key: Path, store: Path, uploads: Path | None = None
) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    doc = {
        "listen": {"host": "127.0.0.1", "port": port},
        "store": str(store),  # one store for both: an upload on either is there for the leader
        **({"uploads_dir": str(uploads)} if uploads else {}),
        "admin_token_file": str(path.parent / "admin.token"),
        "database": {"url": db_url},
        "signing_key": str(key),
        "mqtt": {"url": broker},
        "tick_s": 0.3,
    }
    path.write_text(yaml.safe_dump(doc))
    return path


class Poller:
    """A client polling one replica's API (health and the rollout) until stopped; counts every failure."""

    def __init__(self, url: str, headers: dict[str, str], rid: str):
        self.url, self.headers, self.rid = url, headers, rid
        self.ok, self.failures = 0, []
        self.stop = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self.stop.wait(0.2):
            for path in ("/api/v1/health", f"/api/v1/rollouts/{self.rid}"):
                try:
                    r = httpx.get(self.url + path, headers=self.headers, timeout=5)
                    if r.status_code == 200:
                        self.ok += 1
                    else:
                        self.failures.append(f"{path}: {r.status_code} {r.text[:200]}")
                except httpx.HTTPError as exc:
                    self.failures.append(f"{path}: {type(exc).__name__}: {exc}")


def _sign_in(url: str, token: str) -> str:
    with httpx.Client(base_url=url) as c:
        page = c.get("/login")
        nonce = re.search(r'name="csrf" value="([^"]*)"', page.text)
        assert nonce, page.text[:300]
        r = c.post("/login", data={"token": token, "next": "/", "csrf": nonce.group(1)})
        assert r.status_code == 303 and r.headers["location"] == "/", r.text[:300]
        return c.cookies["eacp_session"]


def _enroll(sim: Simulator, url: str, h: dict[str, str], tmp: Path) -> None:
    grant = httpx.post(url + "/api/v1/enroll-tokens", json={"name": "lab", "groups": ["lab"], "uses": 9}, headers=h)
    (tmp / "enroll.token").write_text(grant.json()["token"])
    for dev, cls in sim.device_class.items():
        agent_yaml = tmp / f"{dev}.yaml"
        agent_yaml.write_text(yaml.safe_dump(sim._config_dict(dev, cls)))
        r = edge_agent(
            "control-plane", "enroll", "--agent-config", agent_yaml, "--url", url, "--token-file", tmp / "enroll.token"
        )
        assert r.returncode == 0 and json.loads(r.stdout)["state"] == "accepted", r.stderr


def test_two_replicas_leader_killed_mid_rollout(tmp_path, pg):
    from agent.cli.fleet_cp import _upload

    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        ports = free_port(), free_port()
        urls = [f"http://127.0.0.1:{p}" for p in ports]
        store = tmp_path / "store"
        cfgs = [
            _config(tmp_path / n / "cp.yaml", p, pg, broker.url, key, store) for n, p in zip("ab", ports, strict=True)
        ]
        logs = [tmp_path / "a.log", tmp_path / "b.log"]
        desired: Counter[str] = Counter()
        watcher = MqttLink(BrokerConfig(broker.url), client_id="desired-counter").start()
        seen: list = []

        def count(topic: str, payload: bytes, retained: bool) -> None:
            seen.append((topic.split("/")[2], hashlib.sha256(payload).hexdigest()[:12], retained, time.time()))
            if payload and not retained:  # a publication; a retained one is the broker replaying the current
                desired.update([topic.split("/")[2]])  # state to a (re)subscription (MqttLink asks once more)

        watcher.subscribe("edge/devices/+/desired/tiny", count)
        sim = Simulator(
            3,
            broker=BrokerConfig(broker.url),
            trust=[str(pub)],
            groups=["lab"],
            id_prefix="rp",
            sysroots=[str(sysroots.root() / "rpi5-8gb")],
            state_dir=str(tmp_path / "sim"),
            probation_s=1.0,
        ).start()
        a = start_cp(cfgs[0], logs[0])
        procs = [a]
        try:
            wait_for(lambda: cp_health(urls[0]), 60, "replica a up")
            b = start_cp(cfgs[1], logs[1])
            procs.append(b)
            wait_for(lambda: cp_health(urls[1]), 60, "replica b up")
            ha, hb = cp_health(urls[0]), cp_health(urls[1])
            assert ha["leader"]["leading"] and not hb["leader"]["leading"], (ha["leader"], hb["leader"])
            assert hb["leader"]["holder"] == ha["leader"]["replica"] and hb["fleet_loop"]["running"] is False
            token = (cfgs[0].parent / "admin.token").read_text().strip()
            h = {"Authorization": f"Bearer {token}"}
            # a dashboard sign-in on a works on b
            cookie = _sign_in(urls[0], token)
            page = httpx.get(urls[1] + "/", cookies={"eacp_session": cookie})
            assert page.status_code == 200, (page.status_code, page.headers.get("location"))
            # devices enroll through b (the standby); the leader a notices them and verifies their status
            _enroll(sim, urls[1], h, tmp_path)

            def verified():
                devs = httpx.get(urls[0] + "/api/v1/devices", headers=h).json()["devices"]
                return len(devs) == 3 and all(d["status_ts"] and d["online"] for d in devs)

            wait_for(verified, WAIT_S, "3 verified statuses", step=0.5)
            pkg = write_package(tmp_path / "tiny-1", tiny_model(1.0), name="tiny", version="1")
            _upload(urls[1], token, str(pkg), "tiny", "1")  # uploaded to b, planned by a: one shared store
            body = {"model": "tiny", "version": "1", "canary": "1", "wave_size": "1", "deadline_s": WAIT_S}
            r = httpx.post(urls[1] + "/api/v1/rollouts", json=body, headers=h)
            assert r.status_code in (200, 201, 202), r.text
            poller = Poller(urls[1], h, "tiny-1")
            poller.thread.start()

            def counts():
                r = httpx.get(urls[1] + "/api/v1/rollouts/tiny-1", headers=h).json()
                return (r.get("progress") or {}).get("counts") or {}

            wait_for(lambda: 1 <= counts().get("succeeded", 0) < 3, WAIT_S, "the first devices of tiny-1", step=0.3)
            fence_before = cp_health(urls[1])["leader"]["fence"]
            killed = time.time()
            a.send_signal(signal.SIGKILL)
            a.wait()
            took = wait_for(
                lambda: (d := cp_health(urls[1])) and d["leader"]["leading"] and d["leader"],
                30,
                "b takes over",
                step=0.1,
            )
            takeover_s = took["leading_since"] - killed
            print(f"takeover after the leader's SIGKILL: {takeover_s:.2f} s (lease_s {took['lease_s']:g})")
            assert takeover_s < 10.0, took
            assert took["fence"] == fence_before + 1 and took["takeovers"] == 1, took
            done = wait_for(
                lambda: (
                    (r := httpx.get(urls[1] + "/api/v1/rollouts/tiny-1", headers=h).json())["phase"] == "finished" and r
                ),
                WAIT_S,
                "tiny-1 finished on b",
                step=0.5,
            )
            poller.stop.set()
            poller.thread.join(timeout=10)
            assert done["state"] == "completed", done["progress"]["counts"]
            assert poller.failures == [] and poller.ok > 0, poller.failures[:5]
            # no device received its desired state twice: counted on the broker, recorded in the ledger
            time.sleep(1.0)  # anything published late would be counted too
            assert dict(desired) == {d: 1 for d in sim.agents}, (dict(desired), seen, killed)
            for dev in sim.agents:
                journals = [json.loads(p.read_text()) for p in (sim.state_dir / dev / "deployments").glob("*.json")]
                ones = [j for j in journals if j.get("model") == "tiny" and j.get("version") == "1"]
                assert len(ones) == 1, (dev, journals)
            r = edge_agent("control-plane", "--config", cfgs[1], "leader", "--json")
            assert r.returncode == 0, r.stderr
            lead = json.loads(r.stdout)
            assert lead["holder"] == took["replica"] and lead["fence"] == took["fence"], lead
            # a replica started again joins as a standby; the leader stopped cleanly hands the lease over at once
            a = start_cp(cfgs[0], logs[0])
            procs.append(a)
            wait_for(lambda: cp_health(urls[0]), 60, "replica a up again")
            assert not cp_health(urls[0])["leader"]["leading"]
            stopped = time.time()
            stop(b, 30)
            back = wait_for(
                lambda: (d := cp_health(urls[0])) and d["leader"]["leading"] and d["leader"], 30, "a leads", step=0.1
            )
            print(f"handover after the leader's SIGTERM: {back['leading_since'] - stopped:.2f} s")
            assert back["fence"] == took["fence"] + 1, back
        finally:
            for p in procs:
                stop(p, 30)
            sim.stop()
            watcher.stop()


def test_an_upload_through_one_replica_is_planned_and_served_by_the_other(tmp_path, pg):
    """Each replica has a `store` of its own and both name one `uploads_dir`: a package uploaded through replica a
    (the standby) is planned, signed and served to light devices by replica b (the leader), and the shared
    directory holds the blob whole (written to a temporary file, synced, renamed) and no partial file."""
    from agent.samples import tiny_model
    from agent.sim.light import LightFleet, LightOptions

    with Mosquitto(tmp_path / "mosquitto") as broker:
        key, pub, _ = generate(tmp_path / "keys")
        port_a, port_b = free_port(), free_port()
        url_a, url_b = f"http://127.0.0.1:{port_a}", f"http://127.0.0.1:{port_b}"
        shared = tmp_path / "uploads"
        cfg_b = _config(tmp_path / "b" / "cp.yaml", port_b, pg, broker.url, key, tmp_path / "b" / "store", shared)
        cfg_a = _config(tmp_path / "a" / "cp.yaml", port_a, pg, broker.url, key, tmp_path / "a" / "store", shared)
        procs = [start_cp(cfg_b, tmp_path / "b.log")]
        fleet = None
        try:
            wait_for(lambda: cp_health(url_b), 60, "replica b up")
            procs.append(start_cp(cfg_a, tmp_path / "a.log"))
            wait_for(lambda: cp_health(url_a), 60, "replica a up")
            assert cp_health(url_b)["leader"]["leading"] and not cp_health(url_a)["leader"]["leading"]
            h = {"Authorization": f"Bearer {(cfg_b.parent / 'admin.token').read_text().strip()}"}
            grant = httpx.post(url_a + "/api/v1/enroll-tokens", json={"name": "up", "uses": 3}, headers=h).json()
            opts = LightOptions(id_prefix="up", control_plane=url_a, enroll_token=grant["token"], probation_s=0.5,
                                clients=1)  # fmt: skip
            fleet = LightFleet(3, BrokerConfig(broker.url), [str(pub)], opts)
            fleet.start()

            def verified() -> bool:
                devs = httpx.get(url_a + "/api/v1/devices", headers=h).json()["devices"]
                return len(devs) == 3 and all(d["status_ts"] for d in devs)

            wait_for(verified, WAIT_S, "3 verified statuses", step=0.5)
            blob = tiny_model(1.0).SerializeToString()
            r = httpx.put(url_a + "/api/v1/models/tiny/versions/1", content=blob, headers=h)
            assert r.status_code == 201, r.text
            sha = hashlib.sha256(blob).hexdigest()
            assert (shared / "blobs" / "sha256" / sha).read_bytes() == blob
            assert not list((tmp_path / "a" / "store").rglob(sha)) and not list((tmp_path / "b" / "store").rglob(sha))
            body = {"model": "tiny", "version": "1", "canary": "1", "wave_size": "2", "deadline_s": WAIT_S}
            assert httpx.post(url_a + "/api/v1/rollouts", json=body, headers=h).status_code == 202

            def finished():
                got = httpx.get(url_a + "/api/v1/rollouts/tiny-1", headers=h).json()
                return got["phase"] in ("finished", "failed") and got

            done = wait_for(finished, WAIT_S, "tiny-1 ended", step=0.5)
            assert done["state"] == "completed" and done["progress"]["counts"].get("succeeded") == 3, done
            assert fleet.counts["committed"] == 3 and fleet.counts["failed"] == 0, fleet.counts
            assert cp_health(url_b)["leader"]["leading"]  # b planned it from the shared directory all along
            leftovers = [p.name for p in shared.rglob("*") if p.is_file() and (".tmp" in p.name or ".src" in p.name)]
            assert leftovers == [] and not list(shared.glob("tmp*")), leftovers
        finally:
            if fleet is not None:
                fleet.stop()
            for p in procs:
                stop(p, 30)
