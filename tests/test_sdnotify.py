"""agent.sdnotify against a real unix datagram socket bound by the test (path and abstract namespace)."""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
import threading

import pytest

from agent.sdnotify import SdNotifier


@pytest.fixture
def listener():
    """A bound AF_UNIX datagram socket playing systemd; short path (sun_path is 108 bytes)."""
    d = tempfile.mkdtemp(prefix="sd", dir="/tmp")
    path = os.path.join(d, "notify")
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(path)
    s.settimeout(30)
    yield s, path
    s.close()
    shutil.rmtree(d)


def recv(sock) -> dict[str, str]:
    data = sock.recv(4096).decode()
    assert data.endswith("\n")
    return dict(line.split("=", 1) for line in data.splitlines())


def drain(sock) -> list[dict[str, str]]:
    out = []
    sock.setblocking(False)
    try:
        while True:
            out.append(dict(kv.split("=", 1) for kv in sock.recv(4096).decode().splitlines()))
    except BlockingIOError:
        pass
    finally:
        sock.settimeout(30)
    return out


def test_ready_status_stopping_on_path_socket(listener):
    sock, path = listener
    env = {"NOTIFY_SOCKET": path, "OTHER": "x"}
    sd = SdNotifier.from_env(env)
    assert sd.enabled and sd.watchdog_interval_s is None
    assert "NOTIFY_SOCKET" not in env and env == {"OTHER": "x"}  # children do not inherit it
    assert sd.ready("serving 1 model")
    assert recv(sock) == {"READY": "1", "MAINPID": str(os.getpid()), "STATUS": "serving 1 model"}
    assert sd.status("deploying resnet 4:\nqualifying")
    assert recv(sock) == {"STATUS": "deploying resnet 4: qualifying"}  # one line, never a second assignment
    assert sd.reloading()
    msg = recv(sock)
    assert msg["RELOADING"] == "1" and int(msg["MONOTONIC_USEC"]) > 0
    assert sd.extend_timeout(90)
    assert recv(sock) == {"EXTEND_TIMEOUT_USEC": "90000000"}
    assert sd.stopping("draining 2 requests")
    assert recv(sock) == {"STOPPING": "1", "STATUS": "draining 2 requests"}
    sd.close()


def test_abstract_namespace(listener):
    name = f"edge-agent-test-{os.getpid()}-{id(listener)}"
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.bind(b"\0" + name.encode())
    s.settimeout(30)
    try:
        sd = SdNotifier.from_env({"NOTIFY_SOCKET": "@" + name})
        assert sd.ready()
        assert recv(s)["READY"] == "1"
    finally:
        s.close()


def test_no_socket_is_a_noop():
    sd = SdNotifier.from_env({})
    assert not sd.enabled
    assert sd.ready() is False and sd.watchdog() is False and sd.stopping() is False
    assert sd.watchdog_interval_s is None and sd.tick(default=2.5) == 2.5


def test_send_failure_is_reported_not_raised(tmp_path):
    sd = SdNotifier(str(tmp_path / "gone"))
    assert sd.ready() is False
    assert "gone" in sd.last_error


def test_watchdog_env_parsing(listener):
    _, path = listener
    assert SdNotifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "20000000"}).watchdog_interval_s == 10.0
    mine = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": str(os.getpid())}
    assert SdNotifier.from_env(mine).watchdog_interval_s == 2.0
    other = {"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "4000000", "WATCHDOG_PID": "1"}
    assert SdNotifier.from_env(other).watchdog_interval_s is None  # meant for another process
    assert SdNotifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "soon"}).watchdog_interval_s is None


def test_tick_keeps_half_interval_cadence(listener):
    sock, path = listener
    now = [100.0]
    sd = SdNotifier(path, watchdog_usec=10_000_000, clock=lambda: now[0])  # interval 5 s
    for _ in range(40):  # 40 ticks, 0.5 s apart on the fake clock = 20 s
        sleep = sd.tick(default=30.0)
        assert 0 <= sleep <= 5.0
        now[0] += 0.5
    pings = sum(1 for m in drain(sock) if m == {"WATCHDOG": "1"})
    assert pings == 4  # at 0, 5, 10, 15 s: half of WATCHDOG_USEC, no more, no less


def test_wedged_main_loop_stops_watchdog_pings(listener):
    sock, path = listener
    sd = SdNotifier.from_env({"NOTIFY_SOCKET": path, "WATCHDOG_USEC": "100000"})  # ping every 50 ms
    stop, wedge, wedged, release = (threading.Event() for _ in range(4))

    def main_loop():
        while not stop.wait(timeout=sd.tick(default=1.0)):
            if wedge.is_set():
                wedged.set()
                release.wait(60)  # stuck: nothing else pings for us

    t = threading.Thread(target=main_loop, daemon=True)
    t.start()
    try:
        for _ in range(5):
            assert recv(sock) == {"WATCHDOG": "1"}
        wedge.set()
        assert wedged.wait(30)
        drain(sock)  # pings sent before the wedge
        sock.settimeout(max(1.0, 20 * sd.watchdog_interval_s))
        with pytest.raises(socket.timeout):
            sock.recv(4096)  # a wedged loop sends nothing, so systemd would restart us
        sock.settimeout(30)
        wedge.clear()
        release.set()
        assert recv(sock) == {"WATCHDOG": "1"}  # alive again
    finally:
        stop.set()
        release.set()
        t.join(30)


def test_a_notify_socket_nobody_reads_never_blocks_the_sender(listener):
    """The receiver's queue holds a few datagrams (net.unix.max_dgram_qlen); past it a send fails, never waits
    (a blocked send stalled a daemon's SIGTERM drain for 60 s under a supervisor that did not read)."""
    sock, path = listener
    sd = SdNotifier(path)
    done = threading.Event()
    results: list[bool] = []

    def send_many():
        results.extend(sd.status(f"step {i}") for i in range(200))
        done.set()

    threading.Thread(target=send_many, daemon=True).start()
    assert done.wait(30), "a send blocked on a full notify socket"
    assert results[0] is True and results[-1] is False and sd.last_error
    assert drain(sock)  # what fitted in the queue arrived
    assert sd.stopping("bye") is True  # room again: sends succeed again
