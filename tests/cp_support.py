"""Test support for the control plane: a real service (uvicorn on a free loopback port, in a thread) and a real
PostgreSQL server started from Debian's binaries into a temporary directory, Debian's chromium driven by
Playwright for the dashboard's tests; the fixtures `pg_server` (one server a
module) and `db_url` (each test on a new SQLite file, then on a new database of that server), shared through
conftest.py."""

from __future__ import annotations

import contextlib
import itertools
import os
import pwd
import shutil
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any, NamedTuple, TypeVar

import httpx
import pytest
from brokers import free_port
from clirunner import EXE, ROOT
from support.wait import wait_for

T = TypeVar("T")
_FOUND = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"))
PG_BIN = Path(os.environ.get("EDGE_AGENT_PG_BIN") or (_FOUND[-1].parent if _FOUND else "/usr/lib/postgresql/15/bin"))
CHROMIUM = os.environ.get("EDGE_AGENT_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def tiny_tarball(tmp: Path, version: str, size: int = 4) -> Path:
    """Package `tiny` at `version` (agent.samples.tiny_model: y = x + version on [1, size]) as a .tar.gz in tmp."""
    from agent.artifacts.packtar import write_targz
    from agent.samples import tiny_model, write_package

    pkg = write_package(tmp / f"tiny-{version}", tiny_model(float(version), size=size), name="tiny", version=version)
    out = tmp / f"tiny-{version}.tar.gz"
    write_targz(pkg, out)
    return out


def artifacts_dir() -> Path:
    """Where the dashboard's screenshots go: $EDGE_AGENT_ARTIFACTS/control-plane/ (default test-artifacts/...)."""
    base = Path(os.environ.get("EDGE_AGENT_ARTIFACTS") or Path(__file__).resolve().parent.parent / "test-artifacts")
    out = base / "control-plane"
    out.mkdir(parents=True, exist_ok=True)
    return out


def need_chromium() -> None:
    """A RuntimeError saying how to install chromium where it is missing (checked before a test starts its parts)."""
    if not Path(CHROMIUM).exists():
        raise RuntimeError(f"{CHROMIUM} not found: apt-get install -y --no-install-recommends chromium")


@contextlib.contextmanager
def chromium() -> Iterator[Any]:
    """A headless chromium (Playwright's Browser), closed at exit."""
    need_chromium()
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@contextlib.contextmanager
def browser_page() -> Iterator[Any]:
    """A 1400x1000 page of a chromium() of its own."""
    with chromium() as browser:
        yield browser.new_page(viewport={"width": 1400, "height": 1000})


def add_running_rollout(factory: Any, rollout_id: str, spec: dict, knobs: dict | None = None, **row: Any) -> None:
    """Write a rollout row straight into the service's database: running, not paused, created by "t" now."""
    from agent.controlplane.db import write
    from agent.controlplane.models import Rollout

    now = time.time()
    with write(factory) as s:
        s.add(
            Rollout(
                rollout_id=rollout_id,
                spec=spec,
                knobs=knobs if knobs is not None else {},
                phase="running",
                paused=False,
                created_by="t",
                created_at=now,
                updated_at=now,
                **row,
            )
        )


def until(what: str, check: Callable[[], T], timeout: float = 120.0, every: float = 0.3) -> T:
    """`check`'s first truthy value, polled every `every` seconds; after `timeout` seconds the test fails on `what`."""
    return wait_for(check, timeout, what, step=every)


def tiny_1_everywhere(api: Any, tmp: Path, devices: int, timeout: float, every: float = 0.3) -> tuple[dict, dict]:
    """Once `devices` accepted devices report verified, online statuses: tiny 1 and 2 uploaded through the API and
    tiny 1 rolled out to the lab group in one wave. Returns (that rollout's request body, tiny-1 once finished)."""

    def verified():
        devs = api.get("/api/v1/devices", params={"state": "accepted", "limit": 100}).json()["devices"]
        return len(devs) == devices and all(d["status_ts"] and d["online"] for d in devs)

    until(f"{devices} verified, online statuses", verified, timeout, every)
    for version in ("1", "2"):
        r = api.put(f"/api/v1/models/tiny/versions/{version}", content=tiny_tarball(tmp, version).read_bytes())
        assert r.status_code == 201, r.text
    body = {"model": "tiny", "version": "1", "group": "lab", "canary": "0", "wave_size": "100%", "deadline_s": timeout}
    assert api.post("/api/v1/rollouts", json=body).status_code == 202
    first = until(
        "tiny-1 finished",
        lambda: (r := api.get("/api/v1/rollouts/tiny-1").json())["phase"] == "finished" and r,
        timeout,
        every,
    )
    return body, first


def start_cp(cfg: Path, log: Path) -> subprocess.Popen:
    """`edge-agent control-plane --config cfg` as its own process, its output appended to `log`."""
    return subprocess.Popen(
        [*EXE, "control-plane", "--config", str(cfg)], cwd=ROOT, stdout=log.open("ab"), stderr=subprocess.STDOUT
    )


def cp_health(url: str) -> dict | None:
    """The service's /api/v1/health document, or None while it does not answer 200."""
    try:
        r = httpx.get(url + "/api/v1/health", timeout=2)
        return r.json() if r.status_code == 200 else None
    except httpx.HTTPError:
        return None


def rollout_done(api: Any, body: dict, timeout: float) -> dict:
    """POST `body` to /api/v1/rollouts with the `api` client (202 asserted), then its view once its phase is
    finished or failed (polled each second; after `timeout` seconds the test fails)."""
    r = api.post("/api/v1/rollouts", json=body)
    assert r.status_code == 202, r.text
    rid = r.json()["rollout_id"]

    def finished():
        got = api.get(f"/api/v1/rollouts/{rid}").json()
        return got if got["phase"] in ("finished", "failed") else None

    return wait_for(finished, timeout, "the release rollout to finish", step=1.0)


@contextlib.contextmanager
def running_service(tmp: Path, port: int | None = None, **doc) -> Iterator:
    """(ControlPlane, base URL) of a service serving on 127.0.0.1 (on `port`, else a free one; https:// when `doc`
    has a tls section); stopped at exit."""
    from agent.controlplane.service import ControlPlane, server
    from agent.controlplane.settings import parse

    port = port or free_port()
    settings = parse({"store": str(tmp / "store"), "listen": {"host": "127.0.0.1", "port": port}, **doc}, tmp)
    cp = ControlPlane(settings).prepare()
    cp.start_fleet()
    srv = server(cp)
    thread = threading.Thread(target=srv.run, daemon=True)
    thread.start()
    deadline = time.monotonic() + 30
    while not srv.started:
        if time.monotonic() > deadline or not thread.is_alive():
            raise RuntimeError("the control plane did not start")
        time.sleep(0.05)
    try:
        yield cp, f"{settings.scheme}://127.0.0.1:{port}"
    finally:
        srv.should_exit = True
        thread.join(timeout=30)
        cp.stop()


class Fleet(NamedTuple):
    broker: Any  # brokers.Mosquitto
    key: Path  # the fleet signing key (private)
    pub: Path  # its public key, what devices trust
    cp: Any  # the ControlPlane
    url: str
    api: httpx.Client  # signed in with the admin token


@contextlib.contextmanager
def fleet_service(tmp: Path) -> Iterator[Fleet]:
    """A Mosquitto broker, a new fleet signing key and a control plane on both (tick 0.3 s) with an admin API
    client; all stopped at exit."""
    from brokers import Mosquitto

    from agent.artifacts.keys import generate

    with Mosquitto(tmp / "mosquitto") as broker:
        key, pub, _ = generate(tmp / "keys")
        doc = {"signing_key": str(key), "mqtt": {"url": broker.url}, "tick_s": 0.3}
        with running_service(tmp / "cp", **doc) as (cp, url):
            headers = {"Authorization": f"Bearer {cp.admin_token}"}
            with httpx.Client(base_url=url, headers=headers, timeout=30) as api:
                yield Fleet(broker, key, pub, cp, url, api)


@contextlib.contextmanager
def postgres(tmp: Path) -> Iterator[str]:
    """A PostgreSQL server of our own (initdb into tmp, a free port, trust auth on loopback); yields its URL."""
    if not (PG_BIN / "initdb").exists():
        raise RuntimeError(
            f"PostgreSQL binaries not found in {PG_BIN}: install Debian's postgresql package "
            "(apt-get install -y --no-install-recommends postgresql) or set EDGE_AGENT_PG_BIN"
        )
    run_as: list[str] = []
    if os.geteuid() == 0:  # initdb refuses root: the server runs as the postgres user, in a directory it can reach
        tmp = Path(tempfile.mkdtemp(prefix="edge-pg-"))
        user = pwd.getpwnam("postgres")
        os.chown(tmp, user.pw_uid, user.pw_gid)
        run_as = ["runuser", "-u", "postgres", "--"]
    data, sock = tmp / "pgdata", tmp / "pgsock"
    subprocess.run([*run_as, "mkdir", "-p", str(sock)], check=True)
    port = free_port()
    init = subprocess.run(
        [*run_as, str(PG_BIN / "initdb"), "-D", str(data), "-U", "postgres", "-A", "trust", "--no-sync"],
        capture_output=True,
        text=True,
    )
    if init.returncode != 0:
        raise RuntimeError(f"initdb failed: {init.stderr.strip()[-500:]}")
    opts = f"-p {port} -k {sock} -c listen_addresses=127.0.0.1 -c fsync=off"
    log = tmp / "pg.log"
    subprocess.run(
        [*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-o", opts, "-l", str(log), "-w", "start"],
        check=True,
        capture_output=True,
    )
    try:
        yield f"postgresql://postgres@127.0.0.1:{port}/postgres"
    finally:
        subprocess.run(
            [*run_as, str(PG_BIN / "pg_ctl"), "-D", str(data), "-m", "immediate", "stop"], capture_output=True
        )
        shutil.rmtree(tmp if run_as else data, ignore_errors=True)


_databases = itertools.count()


@pytest.fixture(scope="module")
def pg_server(tmp_path_factory):
    """The URL of a PostgreSQL server of the test module's own."""
    with postgres(tmp_path_factory.mktemp("pg")) as url:
        yield url


@pytest.fixture(params=["sqlite", "postgresql"])
def db_url(request, tmp_path):
    """A database URL for the test: a new SQLite file, then a new, empty database on the module's `pg_server`."""
    if request.param == "sqlite":
        return f"sqlite:///{tmp_path / 'cp.db'}"
    from sqlalchemy import create_engine, text

    base = request.getfixturevalue("pg_server")
    name = f"cp_{next(_databases)}_{int(time.time() * 1000) % 100000}"
    engine = create_engine(base.replace("postgresql://", "postgresql+psycopg://"), isolation_level="AUTOCOMMIT")
    with engine.connect() as conn:
        conn.execute(text(f'CREATE DATABASE "{name}"'))
    engine.dispose()
    return base.rsplit("/", 1)[0] + "/" + name


def commit_flagged_targets(tmp: Path, names: list[str] | None = None) -> Path:
    """A copy of the shipped target files, those of `names` (default: all) with `serving.unjudged: commit-flagged` (for
    $EDGE_AGENT_TARGETS_DIR): a simulated device serves no traffic, so its probation cannot judge a second version,
    and under the default policy (rollback) it would return to the first by itself; flagged, it keeps the version
    (its rollout waits for an operator's word) until a roll back reaches it."""
    import yaml

    from agent.targets.load import default_directory

    out = tmp / "targets"
    shutil.copytree(default_directory(), out)
    for name in names if names is not None else sorted(p.stem for p in out.glob("*.yaml")):
        doc = yaml.safe_load((out / f"{name}.yaml").read_text())
        doc.setdefault("serving", {})["unjudged"] = "commit-flagged"
        (out / f"{name}.yaml").write_text(yaml.safe_dump(doc, sort_keys=False))
    return out
