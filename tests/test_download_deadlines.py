"""Download deadlines (issue 29, item 6) against a real tarpit: an HTTP server on 127.0.0.1 that answers a Range
request with a valid 206 head and then one byte every two seconds. Its source is abandoned within the download
deadline for the manifest's next source (MQTT, a real artifact server) and the deployment completes while the
previous version keeps serving; `cancel` ends a download stuck on it at once (its connection closes, no puller
is left running); plain http:// sources are not contacted unless the config allows them."""

from __future__ import annotations

import re
import select
import socket
import sys
import threading
import time

import numpy as np
import pytest
from cp_support import commit_flagged_targets
from support.agent import make_agent
from support.mqtt import mqtt_config
from support.sockets import accept_each
from support.wait import wait_for

from agent.artifacts.fetch import fetch_artifact
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactRefused
from agent.samples import sample_tiny_package


class Tarpit:
    """Accepts, reads a request head, sends a 206 head for the asked range, then one byte every `every` s."""

    def __init__(self, every: float = 2.0):
        self.every = every
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        self.open = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._accept, daemon=True).start()

    def url(self, sha: str) -> str:
        return f"http://127.0.0.1:{self.port}/blobs/sha256/{sha}"

    def _accept(self) -> None:
        accept_each(self.sock, self._stop, self._started)

    def _started(self, conn: socket.socket) -> None:
        with self._lock:
            self.connections += 1
            self.open += 1
        threading.Thread(target=self._serve, args=(conn,), daemon=True).start()

    def _serve(self, conn: socket.socket) -> None:
        try:
            self._drip(conn)
        except OSError:
            return
        finally:
            conn.close()
            with self._lock:
                self.open -= 1

    @staticmethod
    def _open_range(conn: socket.socket, size_of) -> tuple[int, int] | None:
        """Read the request head and answer 206 from its Range start to size_of(start); None: the client left."""
        head = b""
        while b"\r\n\r\n" not in head:
            block = conn.recv(4096)
            if not block:
                return None
            head += block
        m = re.search(rb"Range: bytes=(\d+)-", head)
        start = int(m.group(1)) if m else 0
        size = size_of(start)
        conn.sendall(
            f"HTTP/1.1 206 Partial Content\r\nContent-Length: {size - start}\r\n"
            f"Content-Range: bytes {start}-{size - 1}/{size}\r\n\r\n".encode()
        )
        return start, size

    def _drip(self, conn: socket.socket) -> None:
        if self._open_range(conn, lambda start: start + 10_000_000) is None:
            return
        while not self._stop.is_set():
            readable, _, _ = select.select([conn], [], [], self.every)
            if readable and not conn.recv(1):  # the client closed its end
                return
            conn.sendall(b"\0")  # a wrong byte too: the chunk hash would refuse it, were it ever complete

    def close(self) -> None:
        self._stop.set()
        self.sock.close()


@pytest.fixture
def tarpit():
    t = Tarpit()
    yield t
    t.close()


def _agent(tmp_path, mosquitto, cp, downloads: dict | None = None, on_event=None):
    extra = {"downloads": downloads} if downloads is not None else {}
    cfg, _ = mqtt_config(tmp_path / "dev", mosquitto, cp, **extra)
    return make_agent(None, config=cfg, serve_http=False, known_providers=["cpu"], start=True, on_event=on_event)


def _push(cp, tmp_path, version: str, sources):
    pkg = sample_tiny_package(tmp_path / f"pkg-{version}", version=version)
    m = cp.manifest(pkg, "tiny", version, sources=sources(cp, pkg))
    cp.to_device("tiny", cp.envelope(m))
    return m


def _committed(agent, version):
    return getattr(agent.steps.slots.committed("tiny"), "version", None) == version


def _serves(agent) -> float:
    _, out = agent.registry.infer("tiny", {"x": np.zeros((1, 4), np.float32)})
    return float(next(iter(out.values())).ravel()[0])


def _dep(agent, version):
    return next((d for d in agent.orchestrator.journal.all() if d.model == "tiny" and d.version == version), None)


def _sources_with(tarpit):
    def make(cp, pkg):
        from agent.fleet.push import store_package

        sha = store_package(pkg, cp.store_dir, cp.chunk_size, validate=False)["sha256"]
        return [{"type": "http", "url": tarpit.url(sha)}, {"type": "mqtt"}]

    return make


class Answers:
    """Infers on the agent every 20 ms from another thread until stopped; keeps every answer (or error) in order."""

    def __init__(self, agent):
        self.agent, self.seen = agent, []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._loop, daemon=True)
        self._thread.start()

    def _loop(self) -> None:
        while not self._stop.wait(0.02):
            try:
                self.seen.append(_serves(self.agent))
            except Exception as exc:  # noqa: BLE001 - kept and asserted on
                self.seen.append(repr(exc))

    def stop(self) -> list:
        self._stop.set()
        self._thread.join(30)
        return self.seen


def test_a_tarpit_source_is_abandoned_for_mqtt_and_the_deployment_completes(
    tmp_path, mosquitto, plane, tarpit, monkeypatch
):
    # v1 answers all through (Answers): a short probation on a loaded host may not pair enough runs to judge v2,
    # which this test is not about; its targets keep such a version serving, flagged (test_unjudged.py)
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(commit_flagged_targets(tmp_path)))
    events: list[dict] = []
    a = _agent(tmp_path, mosquitto, plane, {"allow_http": True, "interval_s": 3, "min_bytes": 1024}, events.append)
    answers = None
    try:
        _push(plane, tmp_path, "1", lambda cp, pkg: [{"type": "mqtt"}])
        wait_for(lambda: _committed(a, "1"), what="v1 committed")
        answers = Answers(a)  # the previous version serves throughout: every answer is v1's until v2 commits
        _push(plane, tmp_path, "2", _sources_with(tarpit))
        wait_for(lambda: tarpit.connections > 0, 60, "the device tries the tarpit first")
        assert _serves(a) == 1.0  # while v2 is stuck on the tarpit
        wait_for(lambda: _committed(a, "2"), 120, "v2 committed from the MQTT source")
        seen = answers.stop()
        assert seen and seen[0] == 1.0 and set(seen) <= {1.0, 2.0}, [x for x in seen if x not in (1.0, 2.0)][:3]
        assert seen == sorted(seen)  # v1 until the swap, v2 after: never back
        assert _serves(a) == 2.0
        wait_for(lambda: getattr(_dep(a, "2"), "result", None) == "committed", 60, "v2's deployment committed")
        wait_for(lambda: tarpit.open == 0, 10, "the tarpit's connection closed by the device")
        given_up = [e for e in events if e.get("progress") == "source_failed" and e.get("version") == "2"]
        assert given_up and given_up[0]["source"].startswith(f"http://127.0.0.1:{tarpit.port}/"), given_up
        assert "too slow" in given_up[0]["reason"] and "abandoned" in given_up[0]["reason"], given_up
    finally:
        if answers is not None:
            answers.stop()
        a.stop()


def test_plain_http_sources_are_not_contacted_unless_allowed(tmp_path, mosquitto, plane, tarpit):
    a = _agent(tmp_path, mosquitto, plane)  # downloads.allow_http defaults to false
    try:
        _push(plane, tmp_path, "1", _sources_with(tarpit))
        wait_for(lambda: _committed(a, "1"), 120, "v1 committed from the MQTT source")
        assert tarpit.connections == 0
    finally:
        a.stop()
    only_http = plane.manifest(sample_tiny_package(tmp_path / "p9", version="9"), "tiny", "9")
    d = only_http.to_dict()
    d["sources"] = [{"type": "http", "url": tarpit.url(only_http.artifact.sha256)}]
    from agent.artifacts.manifest import Manifest

    with pytest.raises(ArtifactRefused, match="plain http refused .*downloads.allow_http"):
        fetch_artifact(Manifest.from_dict(d), ContentStore(tmp_path / "dev-store"), allow_http=False)
    assert tarpit.connections == 0


def _puller_frames() -> list[str]:
    """Threads now running inside a puller (agent/artifacts/http.py or pull.py)."""
    out = []
    for tid, frame in sys._current_frames().items():
        f = frame
        while f is not None:
            if f.f_code.co_filename.endswith(("agent/artifacts/http.py", "agent/artifacts/pull.py")):
                out.append(f"{tid}:{f.f_code.co_filename}:{f.f_lineno}")
                break
            f = f.f_back
    return out


def test_cancel_stops_a_download_stuck_on_a_tarpit_at_once(tmp_path, mosquitto, plane, tarpit):
    # a progress deadline far away: only the cancel can end this download
    a = _agent(tmp_path, mosquitto, plane, {"allow_http": True, "interval_s": 3600, "min_bytes": 1})
    try:
        pkg = sample_tiny_package(tmp_path / "pkg-1", version="1")
        m = plane.manifest(pkg, "tiny", "1", sources=_sources_with(tarpit)(plane, pkg)[:1])
        plane.to_device("tiny", plane.envelope(m))
        wait_for(lambda: tarpit.open > 0, 60, "the download hangs on the tarpit")
        time.sleep(1.0)
        assert _puller_frames()  # a thread is in the puller now
        dep = a.orchestrator.cancel("tiny")
        assert dep is not None
        wait_for(lambda: (_dep(a, "1") or dep).terminal, 10, "the deployment ends")
        wait_for(lambda: tarpit.open == 0, 10, "the tarpit connection is closed")
        wait_for(lambda: not _puller_frames(), 10, "no thread left in the puller")
        assert "cancel" in ((_dep(a, "1") or dep).reason or "")
    finally:
        a.stop()


def test_stopping_the_daemon_ends_a_download_stuck_on_a_tarpit(tmp_path, mosquitto, plane, tarpit):
    a = _agent(tmp_path, mosquitto, plane, {"allow_http": True, "interval_s": 3600, "min_bytes": 1})
    stopped = False
    try:
        pkg = sample_tiny_package(tmp_path / "pkg-1", version="1")
        m = plane.manifest(pkg, "tiny", "1", sources=_sources_with(tarpit)(plane, pkg)[:1])
        plane.to_device("tiny", plane.envelope(m))
        wait_for(lambda: tarpit.open > 0, 60, "the download hangs on the tarpit")
        a.stop()
        stopped = True
        assert a.stopped(15)  # the state_dir lock is released: no thread was left behind holding it
        wait_for(lambda: tarpit.open == 0, 10, "the tarpit connection is closed")
        assert not _puller_frames()
    finally:
        if not stopped:
            a.stop()


class SlowSource(Tarpit):
    """Serves the real bytes, `block` of them every `every` s (slower than one chunk per stall timeout)."""

    def __init__(self, data: bytes, block: int, every: float):
        self.data, self.block = data, block
        super().__init__(every)

    def _drip(self, conn: socket.socket) -> None:
        opened = self._open_range(conn, lambda start: len(self.data))
        if opened is None:
            return
        start, size = opened
        for at in range(start, size, self.block):
            conn.sendall(self.data[at : at + self.block])
            time.sleep(self.every)


def test_a_slow_source_above_the_progress_deadline_completes(tmp_path):
    """Gaps longer than a read's 0.5 s poll and chunks slower than the stall timeout: partial chunks are kept
    across the resumed requests, so a source that keeps its bytes-per-interval finishes."""
    from test_pull import make_artifact

    from agent.artifacts.deadline import DownloadLimits
    from agent.artifacts.http import HttpPuller

    _, m, data = make_artifact(tmp_path / "cp", 3 * 16384, 16384)
    src = SlowSource(data, 4096, 0.7)
    try:
        watch = DownloadLimits(min_bytes=2048, interval_s=2.0).watch("slow")
        puller = HttpPuller(ContentStore(tmp_path / "dev"), stall_timeout=2.0, retry_delay=0.05)
        assert puller.pull(m, src.url(m.artifact.sha256), watch).read_bytes() == data
        assert src.connections > 1  # reads timed out and were resumed mid-chunk
    finally:
        src.close()
