"""kill -9 of a device in the middle of a delta pull: the restart re-fetches no chunk it had verified."""

import json
import sys
from pathlib import Path

from delta_models import versions
from support.child import kill_when_paused, spawn_child

from agent.artifacts.delta import fetch_delta, prefill
from agent.artifacts.manifest import Manifest
from agent.artifacts.pull import ChunkPuller
from agent.artifacts.recipe import MAX_SIZE, Layout
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer
from agent.fleet.push import store_package
from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig

WINDOW = 2


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
    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    pause_at = m2.artifact.size - changed // 2
    proc = spawn_child(__file__, mosquitto.url, str(store_dir), str(tmp_path / "m2.json"), str(pause_at))
    try:
        kill_when_paused(proc)
        store = ContentStore(store_dir)
        assert not store.has(m2.artifact.sha256) and store.part_path(m2.artifact.sha256).exists()
        served_before = server.stats["bytes"]
        assert 0 < served_before < changed

        a = m2.artifact
        layout = Layout.from_recipe(a.sha256, a.size, dict(a.recipe))
        reused = prefill(store, layout, a.recipe["chunker"])
        assert a.size - reused <= 1.01 * changed  # everything but the changed tensor comes from v1
        dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
        try:
            puller = ChunkPuller(dev, store, window=WINDOW)
            assert puller.pull(m2, layout=layout).read_bytes() == v2.read_bytes()
        finally:
            dev.stop()
        missing_at_restart = layout.count - puller.stats["resumed"]
        assert puller.stats["requested"] == missing_at_restart  # only what was not verified before the kill
        resent = server.stats["bytes"] - (a.size - reused)
        assert resent <= WINDOW * MAX_SIZE, f"{resent} bytes sent twice"  # at most the chunks in flight
        assert server.stats["bytes"] > served_before
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
    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    try:
        assert fetch_artifact(m2, store, link=dev).read_bytes() == v2.read_bytes()  # fixed chunks, same .part
    finally:
        dev.stop()
        server.stop()
    assert server.stats["bytes"] <= changed + 2 * 4096  # the tensor's chunks (its two ends may share one)


if __name__ == "__main__" and sys.argv[1:2] == ["child"]:
    child(*sys.argv[2:6])
