"""`fleet serve --http` (agent.fleet.blob_http): one event loop holds every connection, so a real chunk request
is served beside 1,000 idle connections (issue 29, item 2) with a handful of threads; the connection caps close
the oldest idle connection to make room; idle connections time out; ranges, 404s and 416s as before."""

from __future__ import annotations

import os
import resource
import socket
import subprocess
import sys
import threading
import time

import pytest
from brokers import free_port
from clirunner import ROOT

from agent.artifacts.store import ContentStore
from agent.fleet.blob_http import BlobServer

IDLE = 1000


def _store(tmp_path, size=300_000):
    store = ContentStore(tmp_path / "cp")
    data = os.urandom(size)
    return store, store.put_bytes(data), data


def _idle_crowd(port: int, n: int) -> list[socket.socket]:
    out = []
    for _ in range(n):
        s = socket.create_connection(("127.0.0.1", port), timeout=10)
        out.append(s)
    return out


def _chunk(port: int, sha: str, start: int, end: int, timeout: float = 30.0) -> tuple[int, bytes]:
    """One raw HTTP/1.1 Range request on a fresh connection: (status, body)."""
    with socket.create_connection(("127.0.0.1", port), timeout=timeout) as s:
        s.sendall(
            f"GET /blobs/sha256/{sha} HTTP/1.1\r\nHost: x\r\nRange: bytes={start}-{end}\r\n"
            "Connection: close\r\n\r\n".encode()
        )
        raw = b""
        while chunk := s.recv(65536):
            raw += chunk
    head, _, body = raw.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


def _close_all(socks):
    for s in socks:
        s.close()


def test_a_chunk_is_served_beside_a_thousand_idle_connections_on_one_thread(tmp_path):
    store, sha, data = _store(tmp_path)
    before = threading.active_count()
    server = BlobServer(store, max_per_peer=IDLE + 100).start()
    crowd = _idle_crowd(server.port, IDLE)
    try:
        deadline = time.monotonic() + 30
        while server.open_connections < IDLE and time.monotonic() < deadline:
            time.sleep(0.05)
        assert server.open_connections == IDLE  # all held, none refused
        assert threading.active_count() - before == 1  # the event loop's thread, whatever the crowd
        status, body = _chunk(server.port, sha, 1000, 66535)
        assert status == 206 and body == data[1000:66536]
        assert server.stats["evicted_idle"] == 0 and server.stats["refused"] == 0
    finally:
        _close_all(crowd)
        server.shutdown()


def test_caps_close_the_oldest_idle_connection_to_make_room(tmp_path):
    store, sha, data = _store(tmp_path)
    server = BlobServer(store, max_connections=50, max_per_peer=10_000).start()
    crowd = _idle_crowd(server.port, 200)
    try:
        status, body = _chunk(server.port, sha, 0, 99)
        assert status == 206 and body == data[:100]
        assert server.open_connections <= 50 and server.stats["evicted_idle"] >= 150
    finally:
        _close_all(crowd)
        server.shutdown()
    per_peer = BlobServer(store, max_per_peer=5).start()
    crowd = _idle_crowd(per_peer.port, 20)
    try:
        status, _ = _chunk(per_peer.port, sha, 0, 9)
        assert status == 206 and per_peer.open_connections <= 5
    finally:
        _close_all(crowd)
        per_peer.shutdown()


def test_idle_and_slow_connections_are_closed(tmp_path):
    store, sha, _ = _store(tmp_path, 1000)
    server = BlobServer(store, idle_timeout=0.5, header_timeout=0.5).start()
    try:
        idle = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        slow = socket.create_connection(("127.0.0.1", server.port), timeout=20)
        slow.sendall(b"GET /blobs/sha256/")  # and never the rest of the head
        assert idle.recv(10) == b"" and slow.recv(10) == b""  # closed by the server, not by our timeout
        assert server.open_connections == 0
        status, body = _chunk(server.port, sha, 0, 9)
        assert status == 206 and len(body) == 10
        for path, code in ((f"/blobs/sha256/{'0' * 64}", 404), ("/../../etc/passwd", 404)):
            with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
                s.sendall(f"GET {path} HTTP/1.1\r\nConnection: close\r\n\r\n".encode())
                assert s.recv(100).split()[1] == str(code).encode()
        with socket.create_connection(("127.0.0.1", server.port), timeout=20) as s:
            s.sendall(f"GET /blobs/sha256/{sha} HTTP/1.1\r\nRange: bytes=5000-\r\n\r\n".encode())
            assert s.recv(200).split()[1] == b"416"
            s.sendall(f"HEAD /blobs/sha256/{sha} HTTP/1.1\r\n\r\n".encode())  # keep-alive: same connection
            assert b"Content-Length: 1000" in s.recv(400)
    finally:
        server.shutdown()


def _limit_fds(n: int):
    def apply():
        resource.setrlimit(resource.RLIMIT_NOFILE, (n, n))

    return apply


def test_fleet_serve_http_answers_beside_a_thousand_idle_connections_with_256_descriptors(tmp_path, mosquitto):
    """The CLI, under RLIMIT_NOFILE 256: more idle connections than descriptors; a real request still answers."""
    store, sha, data = _store(tmp_path)
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, "-m", "agent", "fleet", "serve", "--store", str(tmp_path / "cp"), "--broker", mosquitto.url]
        + ["--http", f"127.0.0.1:{port}"],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=_limit_fds(256),
    )
    crowd: list[socket.socket] = []
    try:
        deadline = time.monotonic() + 120
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), timeout=5).close()
                break
            except OSError:
                assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read() if proc.stderr else ""
                time.sleep(0.2)
        crowd = _idle_crowd(port, IDLE)
        status, body = _chunk(port, sha, 4096, 4096 + 65535)
        assert status == 206 and body == data[4096 : 4096 + 65536]
        threads = int(next(ln for ln in open(f"/proc/{proc.pid}/status") if ln.startswith("Threads:")).split()[1])
        assert threads < 32, threads  # not one per connection
        assert len(os.listdir(f"/proc/{proc.pid}/fd")) <= 256
        assert proc.poll() is None
    finally:
        _close_all(crowd)
        proc.terminate()
        proc.wait(30)


@pytest.fixture(autouse=True)
def _enough_fds():
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < 3 * IDLE:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, 4 * IDLE), hard))
    yield
