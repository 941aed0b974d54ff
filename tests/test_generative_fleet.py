"""A generative package through the fleet (issue 39, "Fleet"; docs/generative.md, "Fleet"): `fleet push` of the
package directory (genai_config.json, the decoder, tokenizer files, model.yaml) to a real daemon over the real
broker, delta-capable by default. v1 commits and serves generation; v2, a fine-tune that changes two of the
decoder's weight tensors, moves about those tensors only (the transfer's own counters: bytes_fetched against
bytes_reused), is judged in shadow on the live prompts v1 served, and serves generation; the device's signed
qualification and trial verdicts reach the fleet as for any model."""

from __future__ import annotations

import http.client
import json
import subprocess
from pathlib import Path
from urllib.parse import urlsplit

import numpy as np
import onnx
import pytest
from clirunner import edge_agent
from onnx import numpy_helper
from support.daemon import EXE, ROOT, Daemon, fleet_server, write_config
from support.mqtt import register_device
from support.wait import wait_for

from agent.artifacts.keys import generate
from agent.generative.samples import write_generative_package

pytest.importorskip("onnxruntime_genai")

NAME = "lm"
SHAPE = {"layers": 4, "hidden": 256, "heads": 4}  # a 13.4 MB decoder: 256 KiB to 1 MiB a weight tensor
TIMING = {"prompt_lengths": [16, 32], "tpot_tokens": 16, "repeats": 2, "greedy_tokens": 16}
CHANGED = 2  # weight tensors of the decoder the fine-tune changes


def packages(tmp: Path) -> tuple[Path, Path, int]:
    """(v1, v2, bytes of the tensors v2 changed): v2 is v1 with CHANGED attention weights nudged (1e-4)."""
    v1, v2 = (write_generative_package(tmp / f"pkg{v}", name=NAME, version=v, variants=(), max_length=128,
                                       timing=TIMING, **SHAPE) for v in ("1", "2"))  # fmt: skip
    model = onnx.load(v2 / "model.onnx")
    changed, rng = 0, np.random.default_rng(1)
    names = [i.name for i in model.graph.initializer if i.name.startswith(("wq_", "wo_"))][:CHANGED]
    for i, init in enumerate(model.graph.initializer):
        if init.name in names:
            arr = numpy_helper.to_array(init)
            arr = (arr + rng.standard_normal(arr.shape) * 1e-4).astype(np.float32)
            model.graph.initializer[i].CopyFrom(numpy_helper.from_array(arr, init.name))
            changed += arr.nbytes
    onnx.save(model, v2 / "model.onnx")
    assert changed == CHANGED * 256 * 256 * 4
    return v1, v2, changed


def _push(tmp_path, broker, keyfile, package, version):
    cmd = EXE + ["fleet", "push", str(package), "--name", NAME, "--version", version, "--device", "dev-1"]
    cmd += ["--key", str(keyfile), "--store", str(tmp_path / "cp-store"), "--broker", broker.url]
    out = subprocess.run(cmd + ["--wait", "200", "--json"], cwd=ROOT, capture_output=True, text=True, timeout=260)
    return out.returncode, (json.loads(out.stdout) if out.stdout.strip() else {}), out.stderr


def _generate(url: str, text: str) -> dict:
    addr = urlsplit(url)
    conn = http.client.HTTPConnection(addr.hostname, addr.port, timeout=30)
    body = {"text_input": text, "parameters": {"max_tokens": 8, "temperature": 0}}
    conn.request("POST", f"/v2/models/{NAME}/generate", json.dumps(body))
    resp = conn.getresponse()
    doc = json.loads(resp.read())
    assert resp.status == 200, doc
    return doc


def _deployment(d: Daemon, version: str) -> dict:
    def done():
        dep = ((d.status() or {}).get("deployments") or {}).get(NAME) or {}
        return dep if dep.get("version") == version and dep.get("result") is not None else None

    return wait_for(done, 60, f"deployment of version {version}", d.proc)


def test_a_finetuned_generative_package_moves_only_its_changed_tensors_and_serves(tmp_path, mosquitto):
    v1, v2, changed = packages(tmp_path)
    keyfile, pubfile, _ = generate(tmp_path / "keys")
    cfg = write_config(tmp_path / "dev", mqtt={"url": mosquitto.url}, extra={"trust": {"public_keys": [str(pubfile)]}})
    register_device(tmp_path / "cp-store", "dev-1", tmp_path / "dev" / "state")
    server = fleet_server(tmp_path / "cp-store", mosquitto.url)
    d = Daemon(cfg, tmp_path / "dev" / "state")
    try:
        d.wait_ready()
        rc, doc, err = _push(tmp_path, mosquitto, keyfile, v1, "1")
        assert rc == 0 and doc["devices"]["dev-1"]["result"] == "committed", (err, d.tail())
        first = _deployment(d, "1")
        assert first["bytes_reused"] == 0 and first["bytes_fetched"] > 10_000_000, first  # the gzip of 13.4 MB
        for text in ("once upon a time", "the fleet pushes a fine-tune", "edge devices measure"):
            assert _generate(d.url, text)["model_version"] == "1"  # live prompts for v2's shadow

        rc, doc, err = _push(tmp_path, mosquitto, keyfile, v2, "2")
        assert rc == 0 and doc["devices"]["dev-1"]["result"] == "committed", (err, d.tail())
        dep = _deployment(d, "2")
        total = dep["bytes_fetched"] + dep["bytes_reused"]
        # the two changed tensors (524,288 bytes of 13.4 MB), their pieces compressed, plus model.yaml's piece
        assert changed * 0.8 <= dep["bytes_fetched"] <= 1.1 * changed + 65536, (dep, changed)
        assert dep["bytes_fetched"] < 0.1 * total and dep["bytes_reused"] > 0.9 * total, dep
        assert dep["state"] == "committed" and _generate(d.url, "and now")["model_version"] == "2"
        shadow = dep["shadow"]  # judged on the three live prompts v1 served: a nudge of 1e-4 agrees
        assert shadow["verdict"] == "pass" and shadow["requests"] == 3 and shadow["agreement"] >= 0.98, shadow
        out = edge_agent("fleet", "attestations", "--store", tmp_path / "cp-store", "--broker", mosquitto.url,
                         "--model", NAME, "--json")  # fmt: skip
        rows = json.loads(out.stdout)
        assert {(r["kind"], r["verified"]) for r in rows if r["version"] == "2"} == {
            ("qualification", True),
            ("trial", True),
        }, rows
    finally:
        assert d.terminate() == 0, d.tail()
        server.terminate()
        server.wait(30)
