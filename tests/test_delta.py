"""Delta pulls over a real broker and a real HTTP server: only the chunks a device lacks move."""

import json

import pytest
from delta_models import versions
from support.mqtt import manifest_of

from agent.artifacts.delta import fetch_delta, prefill
from agent.artifacts.http import HttpPuller
from agent.artifacts.manifest import Manifest, ManifestRejected
from agent.artifacts.recipe import CHUNKER, Layout, RecipeBook, compute_recipe
from agent.artifacts.store import ContentStore
from agent.fleet.artifact_server import ArtifactServer, serve_http
from agent.fleet.push import store_package
from agent.transport.device import DeviceLink
from agent.transport.mqtt import BrokerConfig


def manifest_for(path, cp_dir, version, sources=({"type": "mqtt"},), delta=True):
    art = store_package(path, cp_dir, validate=False, delta=delta)
    urls = [dict(s, url=s["url"].format(sha=art["sha256"])) if "url" in s else s for s in sources]
    return manifest_of(art, "mlp", version, devices=["pi-1"], sources=urls, recipe=art.get("recipe"))


@pytest.fixture
def models(tmp_path):
    return versions(tmp_path)


def test_recipe_cuts_at_tensor_data_so_a_finetune_changes_only_that_tensor(models):
    v1, v2, changed = models
    r1, r2 = compute_recipe(v1), compute_recipe(v2)
    assert r1["chunker"] == CHUNKER
    held = {c[0] for c in r1["chunks"]}
    new = sum(n for sha, n in r2["chunks"] if sha not in held)
    assert changed <= new <= 1.01 * changed  # the tensor's bytes, no neighbours
    assert sum(n for _, n in r2["chunks"]) == v2.stat().st_size


def test_tensor_cuts_read_the_wire_format_in_place(models, tmp_path):
    """Every large initializer's raw data, found without parsing the model (an mmap of any size works), equal to
    where onnx's own parse says the bytes are; anything that is not a model has no tensor cuts."""
    import mmap
    import os

    import onnx

    from agent.artifacts.recipe import TENSOR_MIN, tensor_cuts

    v1, _, _ = models
    data = v1.read_bytes()
    expected, pos = [], 0
    for init in onnx.load(v1).graph.initializer:
        if len(init.raw_data) >= TENSOR_MIN:
            at = data.index(init.raw_data, pos)
            expected.append((at, at + len(init.raw_data)))
            pos = at + len(init.raw_data)
    assert expected and tensor_cuts(data) == expected
    with open(v1, "rb") as f, mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
        assert tensor_cuts(mm) == expected
        view = memoryview(mm)
        assert tensor_cuts(view) == expected
        view.release()
    for junk in (os.urandom(100_000), b'{"labels": ["a", "b"]}', data[: len(data) // 2]):
        assert tensor_cuts(junk) == []


def test_manifest_with_recipe_round_trips_and_old_manifests_still_parse(models, tmp_path):
    _, v2, _ = models
    m = manifest_for(v2, tmp_path / "cp", "2")
    again = Manifest.from_dict(json.loads(json.dumps(m.to_dict())))
    assert again.artifact.recipe["chunks"] == m.artifact.recipe["chunks"]
    plain = manifest_for(v2, tmp_path / "cp", "2", delta=False)
    assert "recipe" not in plain.to_dict()["artifact"] and plain.artifact.recipe is None
    bad = m.to_dict()
    bad["artifact"]["recipe"]["chunks"][0][1] += 1  # no longer adds up to the artifact's size
    with pytest.raises(ManifestRejected, match="recipe covers"):
        Manifest.from_dict(bad)


def test_delta_pull_over_mqtt_moves_only_the_changed_tensor(mosquitto, tmp_path):
    v1, v2, changed = versions(tmp_path, layers=4, width=1024)  # a 4 MB tensor: 16 chunks in one request
    cp = ContentStore(tmp_path / "cp")
    m1, m2 = manifest_for(v1, cp.root, "1"), manifest_for(v2, cp.root, "2")
    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    try:
        store = ContentStore(tmp_path / "dev")
        _, first = fetch_delta(m1, store, link=dev)
        assert first == {"bytes_fetched": v1.stat().st_size, "bytes_reused": 0}  # fresh: the full pull
        served = server.stats["bytes"]
        path, moved = fetch_delta(m2, store, link=dev)
        assert path.read_bytes() == v2.read_bytes()
        wire = server.stats["bytes"] - served
        assert moved["bytes_fetched"] == wire <= 1.1 * changed, (moved, wire, changed)
        assert moved["bytes_reused"] == v2.stat().st_size - wire
        assert [p.name for p in store.staging.iterdir()] == []
    finally:
        dev.stop()
        server.stop()


def test_delta_pull_over_http_asks_one_range_per_run_of_missing_chunks(models, tmp_path):
    v1, v2, changed = models
    cp = ContentStore(tmp_path / "cp")
    m2 = manifest_for(v2, cp.root, "2")
    httpd = serve_http(cp, "127.0.0.1:0")
    try:
        store = ContentStore(tmp_path / "dev")
        store.put_file(v1)  # a version the device holds (pulled before recipes existed: its recipe is computed)
        a = m2.artifact
        layout = Layout.from_recipe(a.sha256, a.size, dict(a.recipe))
        reused = prefill(store, layout, a.recipe["chunker"])
        url = f"http://127.0.0.1:{httpd.server_address[1]}/blobs/sha256/{a.sha256}"
        puller = HttpPuller(store)
        assert puller.pull(m2, url, layout=layout).read_bytes() == v2.read_bytes()
        assert puller.stats["received_bytes"] == a.size - reused <= 1.1 * changed
        assert puller.stats["requests"] == 1  # the changed tensor is one run of chunks
    finally:
        httpd.shutdown()


def test_http_only_manifests_pull_whole_then_by_range_through_the_devices_path(models, tmp_path):
    """fetch_delta (what the MQTT source calls) with an http source only (`fleet serve --http`'s BlobServer): the
    first version is a full pull by fixed chunks, the fine-tune moves only its changed tensor by Range requests."""
    v1, v2, changed = models
    cp = ContentStore(tmp_path / "cp")
    httpd = serve_http(cp, "127.0.0.1:0")
    try:
        src = ({"type": "http", "url": f"http://127.0.0.1:{httpd.server_address[1]}/blobs/sha256/{{sha}}"},)
        m1, m2 = manifest_for(v1, cp.root, "1", sources=src), manifest_for(v2, cp.root, "2", sources=src)
        store = ContentStore(tmp_path / "dev")
        path, first = fetch_delta(m1, store)
        assert path.read_bytes() == v1.read_bytes() and first["bytes_reused"] == 0
        sent, asked = httpd.stats["bytes"], httpd.stats["requests"]
        path, moved = fetch_delta(m2, store)
        assert path.read_bytes() == v2.read_bytes()
        assert moved["bytes_fetched"] == httpd.stats["bytes"] - sent <= 1.1 * changed, (moved, changed)
        assert httpd.stats["requests"] - asked == 1  # one run of missing chunks: one Range request
    finally:
        httpd.shutdown()


def test_gc_drops_the_chunks_of_collected_versions(models, tmp_path):
    v1, v2, _ = models
    store = ContentStore(tmp_path / "dev")
    s1, s2 = store.put_file(v1), store.put_file(v2)
    book = RecipeBook(store)
    only_v1 = {c[0] for c in book.ensure(s1)["chunks"]} - {c[0] for c in book.ensure(s2)["chunks"]}
    assert only_v1 and only_v1 <= set(book.index())
    store.gc({s2})  # what the slots keep (committed + previous)
    index = book.index()
    assert not only_v1 & set(index) and not book.path(s1).exists()
    assert all(path.name == s2 for path, _, _ in index.values())


def test_package_tarballs_are_cut_before_compression_so_versions_share_pieces(mosquitto, tmp_path):
    """A package directory (model + config) becomes a gzip stream reset at content-defined points: a fine-tuned
    model in the same package moves about the changed tensor, and the tarball is an ordinary, reproducible one."""
    import shutil
    import tarfile

    from agent.package.load import load_package

    v1, v2, changed = versions(tmp_path, layers=4, width=512)
    pkgs = []
    for n, model in enumerate((v1, v2), 1):
        d = tmp_path / f"pkg{n}"
        d.mkdir()
        shutil.copy(model, d / "model.onnx")
        (d / "config.json").write_text('{"labels": ["a", "b"]}')
        pkgs.append(d)
    cp = ContentStore(tmp_path / "cp")
    m1, m2 = manifest_for(pkgs[0], cp.root, "1"), manifest_for(pkgs[1], cp.root, "2")
    assert m2.artifact.format == "tar.gz" and m2.artifact.recipe is not None
    assert manifest_for(pkgs[1], tmp_path / "cp-again", "2").artifact.sha256 == m2.artifact.sha256  # reproducible
    with tarfile.open(cp.path(m2.artifact.sha256)) as tar:
        assert tar.extractfile("model.onnx").read() == v2.read_bytes()
    assert load_package(cp.path(m2.artifact.sha256)).model_path.name == "model.onnx"

    server = ArtifactServer(cp, BrokerConfig(mosquitto.url)).start()
    dev = DeviceLink(mosquitto.url, "pi-1").start(wait=15)
    try:
        store = ContentStore(tmp_path / "dev")
        fetch_delta(m1, store, link=dev)
        path, moved = fetch_delta(m2, store, link=dev)
        assert path.read_bytes() == cp.path(m2.artifact.sha256).read_bytes()
        assert moved["bytes_fetched"] <= 1.1 * changed and moved["bytes_reused"] > 0, (moved, changed)
    finally:
        dev.stop()
        server.stop()


def test_fleet_rollout_signs_delta_capable_manifests_by_default(mosquitto, tmp_path):
    """`fleet rollout` (run_rollout, what the CLI calls) stores the package with its recipe, and the envelope it
    publishes to a device carries it; the manifest it would sign to roll a device back to a stored version does too."""
    import threading
    import time

    from support.mqtt import register_device
    from support.wait import wait_for

    from agent.artifacts.keys import device_key, generate, trusted_keys
    from agent.fleet.rollout_plan import RolloutSpec
    from agent.fleet.rollout_run import run_rollout, stored_artifact
    from agent.transport.mqtt import MqttLink
    from agent.transport.signing import sign_doc
    from agent.transport.topics import Topics

    v1, _, _ = versions(tmp_path, layers=2, width=256)
    keyfile, pubfile, _ = generate(tmp_path / "keys")
    store, topics = tmp_path / "cp-store", Topics()
    register_device(store, "dev-1", tmp_path / "dev", ["lab"])
    got, lock = [], threading.Lock()

    def keep(topic, payload, retained):
        with lock:
            got.append(bytes(payload))

    link = MqttLink(BrokerConfig(mosquitto.url))
    link.subscribe(topics.device_desired("dev-1", "mlp"), keep)
    link.start(wait=15)
    try:  # dev-1 is online in group lab and runs nothing yet (its own signed, retained status)
        status = {"device_id": "dev-1", "online": True, "groups": ["lab"], "ts": time.time(), "models": {}}
        doc = sign_doc(status, device_key(tmp_path / "dev"))
        link.publish(topics.status("dev-1"), json.dumps(doc).encode(), qos=1, retain=True).wait_for_publish(15)
        spec = RolloutSpec("mlp", "1", group="lab", canary="1", deadline_s=60).validate()
        run_rollout(v1, spec, key_file=keyfile, store=store, broker=BrokerConfig(mosquitto.url), wait=False)
        wait_for(lambda: got, 30, "the rollout's envelope for dev-1")
    finally:
        link.stop()
    m = Manifest.verify(got[0], trusted_keys([pubfile]), device_id="dev-1", groups=["lab"])
    assert m.artifact.recipe is not None and m.artifact.recipe["chunker"] == CHUNKER
    assert [list(c) for c in m.artifact.recipe["chunks"]] == compute_recipe(v1)["chunks"]
    assert stored_artifact(store, m.artifact.sha256)["recipe"]["chunks"] == compute_recipe(v1)["chunks"]
