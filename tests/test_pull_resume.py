"""Kill the device mid-pull (SIGKILL of a real child process): the restart fetches only missing chunks."""

import json
import sys
from pathlib import Path

from support.child import kill_when_paused, spawn_child
from test_pull import make_artifact

from agent.artifacts.manifest import Manifest
from agent.artifacts.pull import ChunkPuller
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig

CHUNK = 64 * 1024
WINDOW = 4


def child(url: str, store_dir: str, manifest_file: str) -> None:
    """The device process: pull and print progress lines until killed."""
    m = Manifest.from_dict(json.loads(Path(manifest_file).read_text()))
    link = DeviceLink(url, "pi-1").start(wait=15)

    def progress(event, done=0, total=1, **_):
        print(event, done, flush=True)
        if event == "chunk" and done >= total * 2 // 5:
            print("paused", done, flush=True)
            sys.stdin.readline()  # blocks until the parent kills us: deterministic on a loaded machine

    ChunkPuller(link, ContentStore(store_dir), window=WINDOW, progress=progress).pull(m)
    print("finished", flush=True)


def test_resume_after_sigkill_fetches_only_missing_chunks(mosquitto, tmp_path):
    cp, m, data = make_artifact(tmp_path / "cp", 160 * CHUNK)
    (tmp_path / "m.json").write_text(json.dumps(m.to_dict()))
    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    store_dir = tmp_path / "dev"
    proc = spawn_child(__file__, mosquitto.url, str(store_dir), str(tmp_path / "m.json"))
    try:
        kill_when_paused(proc)
        store = ContentStore(store_dir)
        assert not store.has(m.artifact.sha256) and store.part_path(m.artifact.sha256).exists()
        served_before = server.stats["bytes"]

        dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
        try:
            puller = ChunkPuller(dev, store, window=WINDOW)
            assert puller.pull(m).read_bytes() == data
        finally:
            dev.stop()
        have_before = puller.stats["resumed"]
        assert have_before >= 160 * 2 // 5 - WINDOW  # the kill lost at most the chunks in flight
        assert puller.stats["requested"] == 160 - have_before  # only missing chunks were asked for
        resent = server.stats["bytes"] - len(data)
        assert resent <= (2 * WINDOW + 1) * CHUNK, f"{resent} bytes sent twice"
        assert list(store.staging.iterdir()) == []
        assert server.stats["bytes"] > served_before
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(*sys.argv[2:5])


def test_server_skips_answers_nobody_needs(mosquitto, tmp_path):
    """A device whose will arrived gets no answers to requests it made before dying; a chunk already sent after
    a request arrived is not sent again for that request (a re-request that overtook a busy server)."""
    import collections
    import time

    from agent.artifacts import chunks

    cp, m, _ = make_artifact(tmp_path / "cp", 8 * CHUNK)
    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    try:
        asked = time.monotonic()
        dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
        dev.stop(graceful=False)  # the broker publishes the will: {"device_id": "pi-1", "online": false}
        deadline = time.monotonic() + 30
        while "pi-1" not in server._gone and time.monotonic() < deadline:
            server._stop.wait(0.05)
        req = chunks.ChunkRequest(m.artifact.sha256, CHUNK, tuple(range(8)))
        server._serve("pi-1", req, asked, collections.deque())
        assert server.stats["cancelled"] == 8 and server.stats["chunks"] == 0

        later = time.monotonic()
        server._serve("pi-2", req, later, collections.deque())
        server._serve("pi-2", req, later, collections.deque())  # the same request again, queued behind the first
        assert server.stats["chunks"] == 8 and server.stats["superseded"] == 8
        server._serve("pi-2", req, time.monotonic(), collections.deque())  # asked after the answers went out
        assert server.stats["chunks"] == 16
    finally:
        server.stop()
