"""kill -9 of a device in the middle of a delta pull: the restart re-fetches no chunk it had verified.

What a pull fetched is counted in the distinct chunks the device asked for (RecordingServer keeps every request):
under load the device's adaptive per-chunk timeout asks again for a chunk whose answer is only late, and the server
then sends it twice. That is the retry doing its job, not a chunk fetched that the device had; counting the bytes
the server sent made these tests fail beside two busy loops and a memory hog (5.06 MB sent for a 4.19 MB change)."""

import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

from delta_models import versions

from agent.artifacts import chunks
from agent.artifacts.delta import fetch_delta, prefill
from agent.artifacts.manifest import Manifest
from agent.artifacts.pull import ChunkPuller
from agent.artifacts.recipe import Layout
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.fleet.push import store_package
from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig

WINDOW = 2


class RecordingServer(ArtifactServer):
    """The real artifact server, keeping (device, chunk_size, index) of every chunk a device asked for."""

    def __init__(self, *args, **kw):
        super().__init__(*args, **kw)
        self.asked: list[tuple[str, int, int]] = []
        self._asked_lock = threading.Lock()

    def _serve(self, device, req, received, infos):
        with self._asked_lock:
            self.asked.extend((device, req.chunk_size, i) for i in req.indices)
        return super()._serve(device, req, received, infos)

    def distinct(self, device: str) -> set[tuple[int, int]]:
        """(chunk_size, index) of every chunk `device` asked for, each once however often it asked."""
        with self._asked_lock:
            return {(c, i) for d, c, i in self.asked if d == device}


def child(url: str, store_dir: str, manifest_file: str, pause_at: str) -> None:
    """The device: a delta pull that prints progress and blocks (until killed) once pause_at bytes are there."""
    m = Manifest.from_dict(json.loads(Path(manifest_file).read_text()))
    link = DeviceLink(url, "pi-1").start(wait=15)

    def progress(event, done=0, **_):
        if event == "chunk" and done >= int(pause_at):
            print("paused", done, flush=True)
            sys.stdin.readline()

    fetch_delta(m, ContentStore(store_dir), link=link, progress=progress, window=WINDOW)
    print("finished", flush=True)


def manifest(path, cp_dir, version):
    art = store_package(path, cp_dir, validate=False)
    return Manifest.for_stored(art, name="mlp", version=version, devices=["pi-1"])


def test_sigkill_mid_delta_pull_resumes_without_refetching(mosquitto, tmp_path):
    v1, v2, changed = versions(tmp_path, layers=4, width=1024)  # 16 MB; one 4 MB tensor changed
    cp = ContentStore(tmp_path / "cp")
    m2 = manifest(v2, cp.root, "2")
    (tmp_path / "m2.json").write_text(json.dumps(m2.to_dict()))
    store_dir = tmp_path / "dev"
    ContentStore(store_dir).put_file(v1)  # the version the device runs
    server = RecordingServer(cp, BrokerConfig(mosquitto.url)).start()
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).parent), os.environ.get("PYTHONPATH", "")]))
    pause_at = m2.artifact.size - changed // 2
    proc = subprocess.Popen(
        [sys.executable, __file__, "child", mosquitto.url, str(store_dir), str(tmp_path / "m2.json"), str(pause_at)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    had = None
    try:
        for line in proc.stdout:
            assert not line.startswith("finished"), "the child finished before it could be killed"
            if line.startswith("paused"):
                proc.send_signal(signal.SIGKILL)
                had = int(line.split()[1])  # bytes it had (reused and verified) when it blocked, then was killed
                break
        proc.wait(30)
        assert had is not None and proc.returncode == -signal.SIGKILL, "the child never paused"
        store = ContentStore(store_dir)
        assert not store.has(m2.artifact.sha256) and store.part_path(m2.artifact.sha256).exists()
        assert 0 < len(server.distinct("pi-1"))

        a = m2.artifact
        layout = Layout.from_recipe(a.sha256, a.size, dict(a.recipe))
        reused = prefill(store, layout, a.recipe["chunker"])
        assert a.size - reused <= 1.01 * changed  # everything but the changed tensor comes from v1
        assert reused < had < a.size  # it had fetched part of the change when it was killed
        # the restart under another device id: the killed device's requests may still be queued at the server
        dev = DeviceLink(mosquitto.url, "pi-2").start(wait=15)
        try:
            puller = ChunkPuller(dev, store, window=WINDOW)
            assert puller.pull(m2, layout=layout).read_bytes() == v2.read_bytes()
        finally:
            dev.stop()
        missing_at_restart = layout.count - puller.stats["resumed"]
        # each chunk not verified before the kill is asked for once, plus those asked for again after the adaptive
        # timeout (an answer late under load: `retries`)
        stats = puller.stats
        assert missing_at_restart <= stats["requested"] <= missing_at_restart + stats["retries"], stats
        asked = server.distinct("pi-2")
        assert {size for size, _ in asked} == {chunks.RECIPE} and len(asked) == missing_at_restart
        # nothing it had at the kill (reused from v1, or fetched and verified) is fetched again
        assert 0 < sum(layout.chunk_len(i) for _, i in asked) <= a.size - had
    finally:
        if proc.poll() is None:
            proc.kill()
        server.stop()


def test_a_delta_pull_that_goes_on_with_fixed_chunks_keeps_every_reused_byte(mosquitto, tmp_path):
    """When a delta pull cannot go on by recipe (an artifact server older than recipes), fetch_delta continues with
    fixed chunks from the same .part: every fixed chunk the reused bytes already fill is kept, also past a changed
    region longer than the recovery scan's gap (4 KiB chunks: the 4 MB tensor is 1,024 of them in a row)."""
    from agent.artifacts.fetch import fetch_artifact

    v1, v2, changed = versions(tmp_path, layers=4, width=1024)  # w2 changed; w3 and b3 lie after it, unchanged
    cp = ContentStore(tmp_path / "cp")
    art = store_package(v2, cp.root, 4096, validate=False)
    m2 = Manifest.for_stored(art, name="mlp", version="2", devices=["pi-1"])
    store = ContentStore(tmp_path / "dev")
    store.put_file(v1)
    a = m2.artifact
    assert a.size - prefill(store, Layout.from_recipe(a.sha256, a.size, dict(a.recipe)), a.recipe["chunker"]) == changed
    server = RecordingServer(cp, BrokerConfig(mosquitto.url)).start()
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    try:
        assert fetch_artifact(m2, store, link=dev).read_bytes() == v2.read_bytes()  # fixed chunks, same .part
    finally:
        dev.stop()
        server.stop()
    asked = server.distinct("pi-1")
    assert {size for size, _ in asked} == {4096}  # fixed chunks only
    assert len(asked) * 4096 <= changed + 2 * 4096  # the tensor's chunks (its two ends may share one)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(*sys.argv[2:6])
