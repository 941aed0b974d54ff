#!/usr/bin/env python3
"""Which chunking reuses more between model versions: fixed blocks, FastCDC, cuts at ONNX tensor data, or both.

    .venv/bin/python bench/bench_delta.py [--layers 16] [--width 1024] [--json] [--pull]

Builds a ~64 MB fp32 MLP (layers x width x width weights) in code and its variants:
  finetune    one weight tensor rewritten (the changed bytes are that tensor's data)
  graph-edit  one node added at the front of the graph (every byte after it shifts)
  int8        onnxruntime.quantization.quantize_dynamic of the fp32 model
  int8-ft     the fine-tune, quantized the same way, against `int8` (a re-quantized variant)
  int8-pc     the same fp32 model quantized again per channel, against `int8` (per tensor): new quantization
              settings for an unchanged model
For each pair and chunker it prints the bytes a device holding the old version must fetch (chunks of the new
version whose sha256 the old version lacks), the ratio to the bytes that really changed where that is known, the
chunk count and the recipe's size in the manifest. --pull also moves the versions for real (Mosquitto on
loopback, ArtifactServer, the device's fetch_delta) and prints the bytes the server sent against the changed bytes
plus the signed envelope (goal for the fine-tune: <= 1.1 x changed + envelope). Not run by the test suite.
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path[:0] = [str(ROOT), str(ROOT / "tests")]

CHUNKERS = ("fixed-256k", "fastcdc-v1", "onnx-tensors-v1", "onnx-tensors+fastcdc-v1")


def mlp(layers: int, width: int, seed: int = 0, extra_node: bool = False):
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    nodes, inits, prev = [], [], "x"
    if extra_node:
        nodes.append(helper.make_node("Identity", [prev], ["x_id"], name="pre"))
        prev = "x_id"
    for i in range(layers):
        w = (rng.standard_normal((width, width)) / np.sqrt(width)).astype(np.float32)
        inits += [numpy_helper.from_array(w, f"w{i}"), numpy_helper.from_array(np.zeros(width, np.float32), f"b{i}")]
        nodes += [
            helper.make_node("MatMul", [prev, f"w{i}"], [f"m{i}"], name=f"mm{i}"),
            helper.make_node("Add", [f"m{i}", f"b{i}"], [f"a{i}"], name=f"add{i}"),
            helper.make_node("Relu", [f"a{i}"], [f"h{i}"], name=f"relu{i}"),
        ]
        prev = f"h{i}"
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, width])],
        [helper.make_tensor_value_info(prev, TensorProto.FLOAT, [1, width])],
        inits,
    )
    return onnx.helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def finetune(model, tensor: str, seed: int = 1):
    """The same model with one weight tensor changed (a fine-tune of one layer); returns (model, changed bytes)."""
    import copy

    import numpy as np
    from onnx import numpy_helper

    m = copy.deepcopy(model)
    for i, init in enumerate(m.graph.initializer):
        if init.name == tensor:
            arr = numpy_helper.to_array(init)
            arr = arr + np.random.default_rng(seed).standard_normal(arr.shape).astype(np.float32) * 1e-3
            m.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr.astype(np.float32), tensor))
            return m, arr.nbytes
    raise KeyError(tensor)


def quantized(src: Path, dst: Path, per_channel: bool = False) -> Path:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    quantize_dynamic(str(src), str(dst), weight_type=QuantType.QInt8, per_channel=per_channel)
    return dst


def recipe(path: Path, chunker: str) -> list[list]:
    import hashlib

    if chunker == "fixed-256k":
        data = path.read_bytes()
        step = 256 * 1024
        return [
            [hashlib.sha256(data[a : a + step]).hexdigest(), len(data[a : a + step])] for a in range(0, len(data), step)
        ]
    from agent.artifacts.recipe import compute_recipe

    rec = compute_recipe(path, chunker)
    assert rec is not None
    return rec["chunks"]


def to_fetch(old: list[list], new: list[list]) -> int:
    have = {c[0] for c in old}
    seen, n = set(), 0
    for sha, length in new:
        if sha not in have and sha not in seen:
            n += length
            seen.add(sha)
    return n


def packages(t: Path) -> None:
    """pkg1 / pkg2: package directories (model.onnx + config.json) of v1 and of the fine-tune."""
    import shutil

    for name, model in (("pkg1", "v1.onnx"), ("pkg2", "ft.onnx")):
        (t / name).mkdir()
        shutil.copy(t / model, t / name / "model.onnx")
        (t / name / "config.json").write_text('{"labels": ["a", "b"]}')


def package_sizes(directory: Path) -> str:
    """The chunkable tar.gz (deflate reset at every cut) against plain gzip of the same tar, same level."""
    import gzip
    import tempfile as tf

    from agent.artifacts import packtar

    with tf.TemporaryDirectory() as td:
        out = Path(td) / "p.tar.gz"
        recipe = packtar.write_targz(directory, out)
        with open(Path(td) / "p.tar", "w+b") as raw:
            packtar._tar(directory, raw)
            raw.seek(0)
            plain = len(gzip.compress(raw.read(), packtar.LEVEL))
        size = out.stat().st_size
    return (
        f"package {directory.name}: chunkable tar.gz {size} bytes in {len(recipe['chunks'])} pieces, plain gzip of "
        f"the same tar {plain} bytes ({size - plain:+d})"
    )


RSS_CHILD = """
import sys, time
import fastcdc.fastcdc_cy  # imported first: its memory is not the recipe's
from agent.artifacts.recipe import compute_recipe

def status(key):
    for line in open("/proc/self/status"):
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024

# VmHWM is this process's own peak (ru_maxrss is not: it keeps the parent's resident size at fork across the
# exec, 433 MB here after the bench's other phases); clear_refs 5 resets it to the present size (Linux >= 4.0)
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")
base = status("VmRSS")
t0 = time.perf_counter()
compute_recipe(sys.argv[1])
peak = status("VmHWM")
print(round(time.perf_counter() - t0, 2), round(peak / 2**20), round((peak - base) / 2**20))
"""


def recipe_rss(path: Path) -> str:
    """What a device pays to index a version it holds without a recipe, measured in a process of its own: the
    peak resident size of that phase alone (VmHWM reset after the imports; mapped file pages included), the growth
    over the process before it, and seconds for compute_recipe."""
    import subprocess

    out = subprocess.run([sys.executable, "-c", RSS_CHILD, str(path)], capture_output=True, text=True, check=True)
    secs, peak, above = out.stdout.split()
    return f"recipe of {path.name} ({path.stat().st_size} bytes) computed in {secs} s, peak RSS {peak} MB ({above} MB above the process before)"


def real_pulls(t: Path, changed: int) -> list[dict]:
    """Device pulls over a real broker: (held version, new version) -> bytes the server sent."""
    from brokers import Mosquitto
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from agent.artifacts.delta import fetch_delta
    from agent.artifacts.manifest import Manifest
    from agent.artifacts.store import ContentStore
    from agent.fleet.artifact_server import ArtifactServer
    from agent.fleet.push import store_package
    from agent.transport.device import DeviceLink
    from agent.transport.mqtt import BrokerConfig

    key = Ed25519PrivateKey.generate()
    cp = ContentStore(t / "cp")

    def manifest(f: str) -> Manifest:
        art = store_package(t / f, cp.root, validate=False)
        return Manifest.for_stored(art, name="mlp", version="1", devices=["bench-dev"])

    rows = []
    with Mosquitto(t / "broker", persistence=False) as broker:
        server = ArtifactServer(cp, BrokerConfig(broker.url)).start()
        link = DeviceLink(broker.url, "bench-dev").start(wait=15)
        try:
            for n, (what, old, new, chg) in enumerate(
                [
                    ("finetune", "v1.onnx", "ft.onnx", changed),
                    ("int8 re-quantized fine-tune", "q1.onnx", "q2.onnx", None),
                    ("fp32->int8", "v1.onnx", "q1.onnx", None),
                    ("int8 per-tensor -> per-channel", "q1.onnx", "q1pc.onnx", None),
                    ("package fine-tune (tar.gz from fleet push)", "pkg1", "pkg2", changed),
                ]
            ):
                store = ContentStore(t / f"dev{n}")
                fetch_delta(manifest(old), store, link=link)  # the version the device runs (a full pull)
                m = manifest(new)
                sent0, t0 = server.stats["bytes"], time.perf_counter()
                _, moved = fetch_delta(m, store, link=link)
                secs, sent = time.perf_counter() - t0, server.stats["bytes"] - sent0
                env = len(m.sign(key))
                rows.append(
                    {
                        "pair": what,
                        "size": m.artifact.size,
                        "server_sent": sent,
                        "envelope_bytes": env,
                        **moved,
                        "changed_bytes": chg,
                        "seconds": round(secs, 2),
                        "goal_1.1x_changed_plus_envelope": (sent <= 1.1 * chg + env) if chg else None,
                    }
                )
        finally:
            link.stop()
            server.stop()
    return rows


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=16)
    ap.add_argument("--width", type=int, default=1024)
    ap.add_argument("--json", action="store_true")
    ap.add_argument("--pull", action="store_true", help="also pull the versions over a real broker")
    args = ap.parse_args()
    import onnx

    with tempfile.TemporaryDirectory() as tmp:
        t = Path(tmp)
        base = mlp(args.layers, args.width)
        onnx.save(base, t / "v1.onnx")
        ft, changed = finetune(base, f"w{args.layers // 2}")
        onnx.save(ft, t / "ft.onnx")
        onnx.save(mlp(args.layers, args.width, extra_node=True), t / "edit.onnx")
        quantized(t / "v1.onnx", t / "q1.onnx")
        quantized(t / "ft.onnx", t / "q2.onnx")
        quantized(t / "v1.onnx", t / "q1pc.onnx", per_channel=True)
        packages(t)
        pairs = [
            ("finetune", "v1.onnx", "ft.onnx", changed),
            ("graph-edit", "v1.onnx", "edit.onnx", None),
            ("fp32->int8", "v1.onnx", "q1.onnx", None),
            ("int8 re-quantized fine-tune", "q1.onnx", "q2.onnx", None),
            ("int8 per-tensor -> per-channel", "q1.onnx", "q1pc.onnx", None),
        ]
        rows = []
        for chunker in CHUNKERS:
            t0 = time.perf_counter()
            recs = {
                f: recipe(t / f, chunker)
                for f in ("v1.onnx", "ft.onnx", "edit.onnx", "q1.onnx", "q2.onnx", "q1pc.onnx")
            }
            secs = (time.perf_counter() - t0) / len(recs)
            for what, a, b, chg in pairs:
                size = (t / b).stat().st_size
                fetch = to_fetch(recs[a], recs[b])
                rows.append(
                    {
                        "pair": what,
                        "chunker": chunker,
                        "size": size,
                        "fetch_bytes": fetch,
                        "reused_share": round(1 - fetch / size, 4),
                        "changed_bytes": chg,
                        "fetch_over_changed": round(fetch / chg, 4) if chg else None,
                        "chunks": len(recs[b]),
                        "recipe_json_bytes": len(json.dumps(recs[b], separators=(",", ":"))),
                        "chunking_s_per_file": round(secs, 3),
                    }
                )
        pulls = real_pulls(t, changed) if args.pull else []
        print(recipe_rss(t / "v1.onnx"))
        if args.pull:
            print(package_sizes(t / "pkg1"))
    if args.json:
        print(json.dumps({"chunkers": rows, "pulls": pulls}, indent=1))
        return 0
    print(
        f"{'pair':30} {'chunker':26} {'size MB':>8} {'fetch MB':>9} {'reused':>7} {'/changed':>9} {'chunks':>7} {'recipe KB':>9}"
    )
    for r in rows:
        oc = f"{r['fetch_over_changed']:.3f}" if r["fetch_over_changed"] else "-"
        print(
            f"{r['pair']:30} {r['chunker']:26} {r['size'] / 1e6:8.2f} {r['fetch_bytes'] / 1e6:9.3f} "
            f"{100 * r['reused_share']:6.1f}% {oc:>9} {r['chunks']:7d} {r['recipe_json_bytes'] / 1e3:9.1f}"
        )
    for p in pulls:
        print(
            f"pull over MQTT, {p['pair']}: server sent {p['server_sent']} of {p['size']} bytes "
            f"(bytes_fetched {p['bytes_fetched']}, bytes_reused {p['bytes_reused']}, envelope {p['envelope_bytes']} B, "
            f"changed {p['changed_bytes'] or 'n/a'}, goal met: {p['goal_1.1x_changed_plus_envelope']}, {p['seconds']} s)"
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
