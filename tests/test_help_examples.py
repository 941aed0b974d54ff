"""Every `--help` example runs as printed (issue 37, 5): each example line of every command's help, pasted into
the directory scripts/quickstart.sh leaves (keys/, cp-store/ with the device registered, agent.yaml of device
quickstart-device in group quickstart, pkg/ holding sample-tiny 1) plus pkg-2/ (sample-tiny 2) and cp.yaml for
the control plane, exits 0, each example in a directory and HOME of its own. A conformance example's HOME has
onnx's node cases in its cache, as after any earlier conformance run (they depend only on the installed onnx,
numpy, ml_dtypes and Python: generating them again per example only repeated the same 10-20 s).
Examples that talk to a broker or a service run against ones this test starts (`mqtt://broker:1883` and
`http://cp:8470` are the test's own); long-running ones (run, fleet serve, fleet simulate, control-plane) must
still run after a while and stop cleanly on SIGTERM; the fleet examples run in an operator's order against a
live daemon and artifact server, as the quickstart starts them."""

from __future__ import annotations

import os
import shlex
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import click
import pytest
import yaml
from brokers import Mosquitto, free_port
from clirunner import ROOT
from support.stop import stop

from agent.cli import cli

pytestmark = [pytest.mark.timeout(3000), pytest.mark.slow]

LONG = ("run", "fleet serve", "fleet simulate", "control-plane --config")  # services: run until stopped
LIVE_ORDER = (  # an operator's order against one live device (the quickstart's daemon and artifact server)
    "fleet push pkg/",
    "fleet status",
    "fleet --context lab status",
    "fleet rollout",
    "fleet attestations",
    "attestation verify",
    "fleet rollback",
    "fleet --context lab push",
    "fleet clear",
    "status",
    "fleet push pkg-2/",  # published, not waited for: the next example cancels it on the device
    "cancel",
    "rollback",
    "release build",  # the agent as a release (issue 40): built, verified, installed beside, asked to be trialled
    "release verify",
    "release install",
    "release list",
    "release activate",
)
CP = (
    "control-plane enroll",
    "control-plane report",
    "fleet unjudged",
    "fleet delete",
    "fleet simulate",
)  # against a running service, in this order
# (`fleet simulate` only with --control-plane: it runs until its devices are accepted, then is stopped)


def _texts(cmd: click.Command, path: tuple[str, ...] = ()):
    yield " ".join(path), (cmd.help or "") + "\n" + (cmd.epilog or "")
    if isinstance(cmd, click.Group):
        ctx = click.Context(cmd, info_name=" ".join(("edge-agent",) + path))
        for name in cmd.list_commands(ctx):
            sub = cmd.get_command(ctx, name)
            if sub is not None:
                yield from _texts(sub, path + (name,))


def examples() -> list[str]:
    """Every example command line of every --help, once, without its trailing comment."""
    out: list[str] = []
    for _, text in _texts(cli):
        for line in text.splitlines():
            line = line.strip()
            if not line.startswith("edge-agent "):
                continue
            line = line.split("  ")[0].strip()  # two spaces, then a comment
            if line not in out:
                out.append(line)
    return out


def _kind(line: str) -> str:
    words = line.removeprefix("edge-agent ")
    if any(words.startswith(w + " ") for w in CP) and ("--control-plane " in words or "fleet simulate" not in words):
        return "cp"
    if any(words == w or words.startswith(w + " ") for w in LONG) and not {"token", "leader"} & set(words.split()):
        return "long"
    if any(words == w or words.startswith(w + " ") for w in LIVE_ORDER):
        return "live"
    return "offline"


def _live_rank(line: str) -> int:
    words = line.removeprefix("edge-agent ")
    return next(i for i, w in enumerate(LIVE_ORDER) if words == w or words.startswith(w + " "))


def _workspace(dest: Path, broker_url: str) -> Path:
    """The quickstart's directory: fleet keys, agent.yaml, the device's key registered, the sample package."""
    from agent.samples import sample_tiny_package

    dest.mkdir(parents=True)
    _ok(["keys", "generate", "--out", "keys"], dest)
    doc = {
        "device_id": "quickstart-device",
        "groups": ["quickstart"],
        "state_dir": "state",
        "serving": {"host": "127.0.0.1", "port": free_port(), "grpc_port": free_port()},
        "telemetry": {"interval_s": 10},
        "mqtt": {"url": broker_url, "topic_prefix": "edge"},
        "trust": {"public_keys": ["keys/fleet.pub"]},
    }
    (dest / "agent.yaml").write_text(yaml.safe_dump(doc))
    _ok(["keys", "device", "--config", "agent.yaml"], dest)
    _ok(
        [
            *("fleet", "register", "quickstart-device", "--public-key", "state/device.pub"),
            *("--group", "quickstart", "--store", "cp-store"),
        ],
        dest,
    )
    sample_tiny_package(dest / "pkg", name="sample-tiny", version="1")
    sample_tiny_package(dest / "pkg-2", name="sample-tiny", version="2")  # another model: a rollback has a target
    cp = {
        "listen": {"host": "127.0.0.1", "port": free_port()},
        "store": "cp-store",
        "mqtt": {"url": broker_url},
        "signing_key": "keys/fleet.key",
    }
    (dest / "cp.yaml").write_text(yaml.safe_dump(cp))
    return dest


@pytest.fixture(scope="module")
def node_cases(tmp_path_factory) -> Path:
    """onnx's node-case cache file, made once: this user's own when an earlier run kept it (the core lane's
    tests/test_conformance.py does), else generated here into a private directory."""
    from agent.conformance import nodecache

    root = tmp_path_factory.mktemp("node-cases")
    root.chmod(0o700)
    kept = nodecache.cache_file()
    with pytest.MonkeyPatch.context() as env:
        env.setenv("EDGE_AGENT_CACHE_DIR", str(root))
        name = nodecache.cache_file()
        assert name is not None
        if kept is not None and kept.is_file():
            shutil.copy2(kept, name)
        else:
            gen = "from agent.conformance.node import load_cases; load_cases()"
            subprocess.run([sys.executable, "-c", gen], env={**os.environ, "PYTHONPATH": str(ROOT)}, check=True)
    assert name.is_file(), name
    return name


def _seed(work: Path, cases: Path) -> None:
    """Put the node-case cache where an example run in `work` looks for it (its HOME, unless the environment
    names another cache directory), private as agent.conformance.nodecache requires."""
    env = _env(work)
    root = Path(
        env.get("EDGE_AGENT_CACHE_DIR")
        or Path(env.get("XDG_CACHE_HOME") or Path(env["HOME"]) / ".cache") / "edge-agent"
    )
    root.mkdir(mode=0o700, parents=True, exist_ok=True)
    if not (root / cases.name).exists():
        try:
            os.link(cases, root / cases.name)
        except OSError:
            shutil.copy2(cases, root / cases.name)


def _env(work: Path, probation_s: str = "1") -> dict[str, str]:
    return {
        **os.environ,
        "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}",
        "PYTHONPATH": str(ROOT),
        "EDGE_AGENT_PROBATION_S": probation_s,
        "EDGE_AGENT_QUALIFY_BUDGET_S": "0.5",
        "EDGE_AGENT_FLEET_CONTEXTS": str(work / "fleet-contexts.yaml"),
        "HOME": str(work),
    }


def _ok(args: list[str], cwd: Path) -> None:
    r = subprocess.run([sys.executable, "-m", "agent", *args], cwd=cwd, capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, (args, r.stdout, r.stderr)


def _shell(line: str, cwd: Path, urls: dict[str, str], timeout: float = 900) -> subprocess.CompletedProcess:
    for printed, real in urls.items():
        line = line.replace(printed, real)
    cmd = "edge-agent " + line.removeprefix("edge-agent ")
    return subprocess.run(
        ["bash", "-o", "pipefail", "-c", cmd], cwd=cwd, capture_output=True, text=True, timeout=timeout, env=_env(cwd)
    )


def _spawn(line: str, cwd: Path, urls: dict[str, str], log: Path, probation_s: str = "1") -> subprocess.Popen:
    for printed, real in urls.items():
        line = line.replace(printed, real)
    env = _env(cwd, probation_s)
    return subprocess.Popen(shlex.split(line), cwd=cwd, env=env, stdout=log.open("wb"), stderr=subprocess.STDOUT)


@pytest.fixture(scope="module")
def broker(tmp_path_factory):
    if shutil.which("edge-agent", path=str(Path(sys.executable).parent)) is None:
        raise RuntimeError(f"edge-agent is not installed beside {sys.executable}: pip install -e .")
    if shutil.which("jq") is None:
        raise RuntimeError("jq is not installed (examples pipe --json into it): apt-get install -y jq")
    with Mosquitto(tmp_path_factory.mktemp("mosquitto")) as b:
        yield b


def test_every_example_is_collected_and_classified():
    found = examples()
    assert len(found) >= 30, found
    assert any(e.startswith("edge-agent fleet push pkg/ ") for e in found)
    assert {_kind(e) for e in found} == {"offline", "long", "live", "cp"}
    assert all(e.split()[0] == "edge-agent" for e in found)


@pytest.mark.parametrize("line", [e for e in examples() if _kind(e) == "offline"])
def test_offline_example_runs_as_printed(line, tmp_path, broker, request):
    work = _workspace(tmp_path / "qs", broker.url)
    if line.startswith("edge-agent conformance "):
        _seed(work, request.getfixturevalue("node_cases"))
    r = _shell(line, work, {})
    assert r.returncode == 0, (line, r.stdout[-3000:], r.stderr[-3000:])


@pytest.mark.parametrize("line", [e for e in examples() if _kind(e) == "long"])
def test_service_example_runs_until_stopped(line, tmp_path, broker):
    work = _workspace(tmp_path / "qs", broker.url)
    proc = _spawn(line, work, {"mqtt://broker:1883": broker.url}, tmp_path / "log")
    try:
        deadline = time.monotonic() + 8.0
        while time.monotonic() < deadline and proc.poll() is None:
            time.sleep(0.2)
        assert proc.poll() is None, (line, (tmp_path / "log").read_text()[-3000:])
    finally:
        rc = stop(proc, 60)
    assert rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM), (line, rc, (tmp_path / "log").read_text()[-3000:])


def test_fleet_and_control_plane_examples_run_in_order_against_a_live_device(tmp_path, broker):
    work = _workspace(tmp_path / "qs", broker.url)
    contexts = {
        "current": "lab",
        "contexts": {
            "lab": {"broker": broker.url, "store": str(work / "cp-store"), "key": str(work / "keys/fleet.key")}
        },
    }
    (work / "fleet-contexts.yaml").write_text(yaml.safe_dump(contexts))
    urls = {"mqtt://broker:1883": broker.url}
    # a 10 s probation; `cancel` finds its version in flight because the artifact server is stopped around it
    daemon = _spawn("edge-agent run --config agent.yaml", work, urls, tmp_path / "agent.log", probation_s="10")
    serve_line = f"edge-agent fleet serve --store cp-store --broker {broker.url}"
    serve = _spawn(serve_line, work, urls, tmp_path / "serve.log")
    no_wait, cancel = LIVE_ORDER.index("fleet push pkg-2/"), LIVE_ORDER.index("cancel")
    failed = []
    try:
        for line in sorted((e for e in examples() if _kind(e) == "live"), key=_live_rank):
            if _live_rank(line) == no_wait:  # no artifact server: the device waits for chunks, in flight, for cancel
                stop(serve, 60)
            r = _shell(line, work, urls)
            deadline = time.monotonic() + 90
            while _live_rank(line) == cancel and "nothing in flight" in r.stderr and time.monotonic() < deadline:
                time.sleep(1)  # the manifest has not reached the device yet; without chunks it cannot get further
                r = _shell(line, work, urls)
            if r.returncode != 0:
                failed.append((line, r.returncode, r.stdout[-1500:], r.stderr[-1500:]))
            if _live_rank(line) == cancel:
                serve = _spawn(serve_line, work, urls, tmp_path / "serve.log")
        failed += _control_plane_examples(work, tmp_path, broker.url)
    finally:
        stop(serve, 60)
        stop(daemon, 60)
    assert not failed, (failed, (tmp_path / "agent.log").read_text()[-2000:])


def _control_plane_examples(work: Path, tmp_path: Path, broker_url: str) -> list:
    """enroll and report against the control plane cp.yaml starts (the device has decision records by now); a
    simulated fleet enrolls there with the token an admin made for it."""
    import httpx

    url = f"http://127.0.0.1:{yaml.safe_load((work / 'cp.yaml').read_text())['listen']['port']}"
    service = _spawn("edge-agent control-plane --config cp.yaml", work, {}, tmp_path / "cp.log")
    failed = []
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(url + "/api/v1/health", timeout=2).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert service.poll() is None and time.monotonic() < deadline, (tmp_path / "cp.log").read_text()[-2000:]
            time.sleep(0.3)
        admin = (work / "admin.token").read_text().strip()
        grant = httpx.post(
            url + "/api/v1/enroll-tokens",
            json={"name": "quickstart", "groups": ["quickstart"], "uses": 1},
            headers={"Authorization": f"Bearer {admin}"},
        )
        assert grant.status_code in (200, 201), grant.text
        (work / "enroll.token").write_text(grant.json()["token"])  # what the operator hands the device
        ours = [e for e in examples() if _kind(e) == "cp"]
        for line in sorted(ours, key=lambda e: CP.index(next(w for w in CP if e.startswith("edge-agent " + w)))):
            if line.startswith("edge-agent fleet simulate "):
                _token_for(url, admin, work, "sim", 3)
                failed += _simulated_fleet_enrolls(
                    line, work, tmp_path, {"http://cp:8470": url, "mqtt://broker:1883": broker_url}, admin
                )
                continue
            r = _shell(line, work, {"http://cp:8470": url})
            if r.returncode != 0:
                failed.append((line, r.returncode, r.stdout[-1500:], r.stderr[-1500:]))
    finally:
        stop(service, 60)
    return failed


def _token_for(url: str, admin: str, work: Path, group: str, uses: int) -> None:
    """An enrollment token for `uses` devices joining `group`, in work/enroll.token (what the operator hands out)."""
    import httpx

    grant = httpx.post(
        url + "/api/v1/enroll-tokens",
        json={"name": group, "groups": [group], "uses": uses},
        headers={"Authorization": f"Bearer {admin}"},
    )
    assert grant.status_code == 201, grant.text
    (work / "enroll.token").write_text(grant.json()["token"])


def _simulated_fleet_enrolls(line: str, work: Path, tmp_path: Path, urls: dict[str, str], admin: str) -> list:
    """`fleet simulate --control-plane`: runs until its three devices are accepted by the service, stops on SIGTERM."""
    import httpx

    log = tmp_path / "simulate-cp.log"
    proc = _spawn(line, work, urls, log)
    url, accepted = urls["http://cp:8470"], 0
    try:
        deadline = time.monotonic() + 300
        while proc.poll() is None and accepted < 3 and time.monotonic() < deadline:
            time.sleep(1)
            rows = httpx.get(
                url + "/api/v1/devices?state=accepted&group=sim", headers={"Authorization": f"Bearer {admin}"}
            ).json()["devices"]
            accepted = len(rows)
    finally:
        rc = stop(proc, 60)
    if accepted == 3 and rc in (0, -signal.SIGTERM, 128 + signal.SIGTERM):
        return []
    return [(line, rc, f"{accepted} of 3 accepted", log.read_text()[-1500:])]
