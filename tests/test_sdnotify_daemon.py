"""`edge-agent run` under a test-bound NOTIFY_SOCKET: READY once serving, WATCHDOG from the main loop, STATUS,
and on SIGTERM: STOPPING=1, in-flight HTTP requests finish with 200, clean exit 0."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest
from support.sdlisten import NotifyListener

# its waits are the daemon's own start-up window (up to 300 s) and a few minutes of work at load 20 on 2 cores
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1200)]


def http(url: str, timeout: float = 10.0) -> tuple[int, bytes]:
    try:
        with urllib.request.urlopen(url, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()
    except OSError:
        return 0, b""


def wait_http(url: str, proc, timeout: float, log: Path) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"daemon exited {proc.returncode}: {log.read_text()[-3000:]}"
        if http(url, 5)[0] == 200:
            return
        for end in ("failed", "rolled_back", "rejected"):
            assert f"state={end}" not in log.read_text(), f"deployment ended {end}: {log.read_text()[-3000:]}"
        time.sleep(0.2)
    raise AssertionError(f"{url} never answered 200: {log.read_text()[-3000:]}")


def inflight(base: str) -> int:
    status, body = http(f"{base}/metrics")
    for line in body.decode().splitlines():
        if line.startswith("edge_agent_http_inflight_requests"):
            return int(float(line.split()[-1]))
    return -1


@pytest.fixture
def daemon(tmp_path):
    from agent.samples import sample_tiny_package

    inbox = tmp_path / "inbox"
    sample_tiny_package(tmp_path / "pkg", name="tiny", version="1")
    (inbox / "tiny").mkdir(parents=True)
    (tmp_path / "pkg").rename(inbox / "tiny" / "1")
    conf = tmp_path / "agent.yaml"
    conf.write_text(
        f"device_id: sd-test\nstate_dir: {tmp_path / 'state'}\ninbox: {inbox}\n"
        "serving: {host: 127.0.0.1, port: 0}\n"  # free ports for HTTP and gRPC (gRPC's default 8001 may be taken)
    )
    listener = NotifyListener()
    env = dict(
        os.environ,
        NOTIFY_SOCKET=listener.path,
        WATCHDOG_USEC="1000000",
        EDGE_AGENT_QUALIFY_PROVIDERS="cpu",
        EDGE_AGENT_PROBATION_S="1",
    )
    log = tmp_path / "daemon.log"
    with open(log, "wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "agent", "run", "--config", str(conf)], env=env, stdout=out, stderr=subprocess.STDOUT
        )
    try:
        yield proc, listener, log
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(30)
        listener.close()


def test_ready_watchdog_and_sigterm_drain(daemon):
    proc, sd, log = daemon
    msgs = sd.wait_ready(proc, log)  # the start-up window the daemon asked for; its exit ends the wait at once
    base = json.loads((log.parent / "state" / "status.json").read_text())["serving"]["url"]  # written before READY
    assert http(f"{base}/v2/health/live")[0] == 200  # READY=1 only once the HTTP API serves
    ready = next(m for m in msgs if m.get("READY") == "1")
    assert ready.get("MAINPID") == str(proc.pid)
    n = sd.count("WATCHDOG")
    sd.wait_for(
        lambda ms: sum("WATCHDOG" in m for m in ms) >= n + 3, 60, "3 more WATCHDOG=1 from the main loop", proc, log
    )
    wait_http(f"{base}/v2/models/tiny/ready", proc, 240, log)
    assert any("STATUS" in m for m in sd.messages)

    # SIGHUP: RELOADING=1 (with MONOTONIC_USEC), the live part applied, then READY=1 again.
    conf = log.parent / "agent.yaml"
    conf.write_text(conf.read_text() + "telemetry: {interval_s: 30}\n")
    reloads = sd.count("RELOADING")
    proc.send_signal(signal.SIGHUP)

    def reloaded(ms):
        marks = [i for i, m in enumerate(ms) if "RELOADING" in m]
        return len(marks) > reloads and any(m.get("READY") == "1" for m in ms[marks[-1] :])

    msgs = sd.wait_for(reloaded, 60, "RELOADING=1 then READY=1", proc, log)
    reloading = [m for m in msgs if "RELOADING" in m][-1]
    assert int(reloading["MONOTONIC_USEC"]) > 0
    deadline = time.monotonic() + 30
    while not re.search(r"^reloaded applied=\S*telemetry\.interval_s", log.read_text(), re.M):
        assert time.monotonic() < deadline, log.read_text()[-2000:]
        time.sleep(0.1)

    # Requests in flight: headers and half the body sent, so the server is inside each of them.
    body = json.dumps(
        {"inputs": [{"name": "x", "shape": [1, 4], "datatype": "FP32", "data": [1.0, 2.0, 3.0, 4.0]}]}
    ).encode()
    conns = []
    for _ in range(3):
        s = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=60)
        s.sendall(
            b"POST /v2/models/tiny/infer HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
            + f"Content-Length: {len(body)}\r\n\r\n".encode()
            + body[:10]
        )
        conns.append(s)
    deadline = time.monotonic() + 60
    while inflight(base) < len(conns) + 1:  # + the /metrics request itself
        assert time.monotonic() < deadline, "requests never showed as in flight"
        time.sleep(0.05)

    proc.send_signal(signal.SIGTERM)
    sd.wait_for(lambda ms: any(m.get("STOPPING") == "1" for m in ms), 60, "STOPPING=1")
    for s in conns:
        s.sendall(body[10:])
    for s in conns:
        raw = b""
        while b"\r\n\r\n" not in raw or len(raw.split(b"\r\n\r\n", 1)[1]) < _length(raw):
            chunk = s.recv(65536)
            assert chunk, f"connection closed early: {raw!r}"
            raw += chunk
        s.close()
        assert raw.startswith(b"HTTP/1.1 200"), raw[:300]
        doc = json.loads(raw.split(b"\r\n\r\n", 1)[1])
        assert doc["model_version"] == "1"
        assert doc["outputs"][0]["data"] == pytest.approx([2.0, 3.0, 4.0, 5.0])  # tiny v1: x + 1
    assert proc.wait(60) == 0, log.read_text()[-3000:]
    stopping = next(i for i, m in enumerate(sd.messages) if m.get("STOPPING") == "1")
    assert stopping > next(i for i, m in enumerate(sd.messages) if m.get("READY") == "1")


def _length(raw: bytes) -> int:
    head = raw.split(b"\r\n\r\n", 1)[0].decode("latin-1").lower()
    for line in head.split("\r\n"):
        if line.startswith("content-length:"):
            return int(line.split(":", 1)[1])
    return 0
