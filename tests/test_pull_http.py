"""HttpPuller against real HTTP servers on loopback: Range resume after a cut, tampering, our blob server."""

import threading
import urllib.request
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from test_pull import make_artifact

from agent.artifacts.http import HttpPuller
from agent.artifacts.store import ContentStore
from agent.errors import ArtifactError
from agent.fleet.artifact_server import serve_http

CHUNK = 16 * 1024


class _BlobServer:
    """A threaded HTTP/1.1 server on loopback whose GET answers come from the subclass's get(handler)."""

    def __init__(self, data: bytes):
        self.data, self.ranges = data, []
        outer = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            disable_nagle_algorithm = True

            def log_message(self, *a):
                pass

            def do_GET(self):
                outer.get(self)

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.httpd.daemon_threads = True
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/blob"

    def get(self, handler: BaseHTTPRequestHandler) -> None:
        raise NotImplementedError

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


class CuttingServer(_BlobServer):
    """Honours `Range: bytes=N-`; the first response is cut after `cut` bytes (a dropped connection)."""

    def __init__(self, data: bytes, cut: int, corrupt_at: int | None = None):
        self.cut, self.corrupt_at = cut, corrupt_at
        super().__init__(data)

    def get(self, handler: BaseHTTPRequestHandler) -> None:
        rng = handler.headers.get("Range", "bytes=0-")
        self.ranges.append(rng)
        start = int(rng[6:].split("-")[0])
        body = bytearray(self.data[start:])
        if self.corrupt_at is not None and self.corrupt_at >= start:
            body[self.corrupt_at - start] ^= 1
        handler.send_response(206)
        handler.send_header("Content-Range", f"bytes {start}-{len(self.data) - 1}/{len(self.data)}")
        handler.send_header("Content-Length", str(len(body)))
        handler.end_headers()
        if len(self.ranges) == 1:
            handler.wfile.write(bytes(body[: self.cut]))
            handler.wfile.flush()
            handler.close_connection = True
            return
        handler.wfile.write(bytes(body))


def test_cut_connection_resumes_with_a_range_request(tmp_path):
    _, m, data = make_artifact(tmp_path / "cp", 10 * CHUNK + 77, CHUNK)
    server = CuttingServer(data, cut=3 * CHUNK + 500)
    try:
        store = ContentStore(tmp_path / "dev")
        puller = HttpPuller(store, stall_timeout=20, retry_delay=0.05)
        assert puller.pull(m, server.url).read_bytes() == data
        # resumed where the cut left off, mid-chunk (the chunk is still verified whole against the manifest)
        assert server.ranges == ["bytes=0-", f"bytes={3 * CHUNK + 500}-"]
        assert list(store.staging.iterdir()) == []
    finally:
        server.close()


def test_tampered_http_source_is_refused(tmp_path):
    _, m, data = make_artifact(tmp_path / "cp", 6 * CHUNK, CHUNK)
    server = CuttingServer(data, cut=len(data), corrupt_at=4 * CHUNK + 5)
    try:
        store = ContentStore(tmp_path / "dev")
        with pytest.raises(ArtifactError, match="chunk 4 .* does not match"):
            HttpPuller(store, stall_timeout=20, retry_delay=0.05).pull(m, server.url)
        assert not store.has(m.artifact.sha256)
    finally:
        server.close()


def test_our_blob_server_serves_ranges_and_the_puller_uses_it(tmp_path):
    cp, m, data = make_artifact(tmp_path / "cp", 5 * CHUNK + 3, CHUNK)
    httpd = serve_http(cp, "127.0.0.1:0")
    base = f"http://127.0.0.1:{httpd.server_address[1]}/blobs/sha256/"
    try:
        req = urllib.request.Request(base + m.artifact.sha256, headers={"Range": "bytes=10-19"})
        with urllib.request.urlopen(req, timeout=10) as resp:
            assert resp.status == 206 and resp.read() == data[10:20]
        with pytest.raises(urllib.error.HTTPError) as err:
            urllib.request.urlopen(
                urllib.request.Request(base + m.artifact.sha256, headers={"Range": f"bytes={len(data)}-"}), timeout=10
            )
        assert err.value.code == 416
        with pytest.raises(urllib.error.HTTPError):
            urllib.request.urlopen(base + "../../etc/passwd", timeout=10)
        assert HttpPuller(ContentStore(tmp_path / "dev")).pull(m, base + m.artifact.sha256).read_bytes() == data
    finally:
        httpd.shutdown()


def test_unreachable_http_source_stalls_with_a_reason(tmp_path):
    from brokers import free_port

    _, m, _ = make_artifact(tmp_path / "cp", 2 * CHUNK, CHUNK)
    with pytest.raises(ArtifactError, match="stalled.*refused"):
        HttpPuller(ContentStore(tmp_path / "dev"), stall_timeout=1, retry_delay=0.1).pull(
            m, f"http://127.0.0.1:{free_port()}/x"
        )


def test_fetch_falls_back_from_a_dead_mqtt_source_to_http_and_keeps_progress(mosquitto, tmp_path):
    from agent.artifacts.fetch import fetch_artifact
    from agent.artifacts.manifest import Manifest
    from agent.transport.device import DeviceLink

    cp, m, data = make_artifact(tmp_path / "cp", 6 * CHUNK, CHUNK)
    httpd = serve_http(cp, "127.0.0.1:0")
    url = f"http://127.0.0.1:{httpd.server_address[1]}/blobs/sha256/{m.artifact.sha256}"
    d = m.to_dict()
    d["sources"] = [{"type": "mqtt"}, {"type": "http", "url": url}]
    m = Manifest.from_dict(d)
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)  # no artifact server on MQTT: that source stalls
    try:
        assert fetch_artifact(m, ContentStore(tmp_path / "dev"), link=dev, stall_timeout=1).read_bytes() == data
    finally:
        dev.stop()
        httpd.shutdown()
    with pytest.raises(ArtifactError, match="mqtt: no broker connection"):
        fetch_artifact(Manifest.from_dict(dict(d, sources=[{"type": "mqtt"}])), ContentStore(tmp_path / "d2"))


class FlakyCdn(_BlobServer):
    """A CDN that sends the first `cut` bytes of the blob, drops the connection, then answers 404 (gone)."""

    def __init__(self, data: bytes, cut: int):
        self.cut = cut
        super().__init__(data)

    def get(self, handler: BaseHTTPRequestHandler) -> None:
        self.ranges.append(handler.headers.get("Range"))
        if len(self.ranges) > 1:
            handler.send_response(404)
            handler.send_header("Content-Length", "0")
            handler.end_headers()
            return
        handler.send_response(200)
        handler.send_header("Content-Length", str(len(self.data)))
        handler.end_headers()
        handler.wfile.write(self.data[: self.cut])
        handler.wfile.flush()
        handler.close_connection = True


def test_fetch_follows_the_manifest_order_cdn_first_then_mqtt_for_the_rest(mosquitto, tmp_path):
    from agent.artifacts.fetch import fetch_artifact, ordered_sources
    from agent.artifacts.manifest import Manifest
    from agent.fleet.artifact_server import ArtifactServer
    from agent.transport.device import DeviceLink
    from agent.transport.mqtt import BrokerConfig

    cp, m, data = make_artifact(tmp_path / "cp", 12 * CHUNK + 5, CHUNK)
    cdn = FlakyCdn(data, cut=5 * CHUNK + 100)  # 5 whole chunks arrive over http before it goes away
    d = m.to_dict()
    d["sources"] = [{"type": "http", "url": cdn.url}, {"type": "mqtt"}]
    m = Manifest.from_dict(d)
    assert [s.type for s in ordered_sources(m)] == ["http", "mqtt"]
    assert [s.type for s in ordered_sources(m, order=("mqtt", "http"))] == ["mqtt", "http"]
    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    events = []
    try:
        path = fetch_artifact(
            m, ContentStore(tmp_path / "dev"), link=dev, stall_timeout=30, progress=lambda e, **f: events.append((e, f))
        )
        assert path.read_bytes() == data
    finally:
        dev.stop()
        server.stop()
        cdn.close()
    sources = [f["source"] for e, f in events if e == "source"]
    assert sources == [cdn.url, "mqtt"]  # the CDN first, as listed
    assert cdn.ranges[0] == "bytes=0-"
    assert server.stats["chunks"] == m.artifact.count - 5  # MQTT fetched only what the CDN had not delivered
