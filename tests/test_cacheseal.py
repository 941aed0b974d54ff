"""Compiled caches are sealed when written and verified before use (agent.package.cacheseal): a corrupted,
missing or foreign file empties the directory, the runtime compiles afresh, and the damaged file is never loaded."""

from __future__ import annotations

import json

import pytest
import realmodels as rm

from agent.lifecycle.serve import open_and_warm
from agent.lifecycle.slots import SlotEntry
from agent.package import cacheseal

SHA = "0" * 64  # the slot entry's artifact digest: not read when a session is opened


def test_seal_then_verify_detects_corrupt_missing_and_foreign_files(tmp_path):
    (tmp_path / "a.blob").write_bytes(b"x" * 100)
    (tmp_path / "sub").mkdir()
    (tmp_path / "sub" / "b.blob").write_bytes(b"y" * 10)
    doc = cacheseal.seal(tmp_path)
    assert set(doc["files"]) == {"a.blob", "sub/b.blob"} and cacheseal.problems(tmp_path) == []
    (tmp_path / "a.blob").write_bytes(b"x" * 99 + b"z")  # same size, other bytes
    assert "content differs from its sealed sha256" in cacheseal.problems(tmp_path)[0]
    cacheseal.seal(tmp_path)
    (tmp_path / "stranger.blob").write_bytes(b"!")
    assert cacheseal.problems(tmp_path) == [f"{tmp_path / 'stranger.blob'}: not in the seal (foreign)"]
    (tmp_path / "stranger.blob").unlink()
    (tmp_path / "sub" / "b.blob").unlink()
    assert cacheseal.problems(tmp_path) == [f"{tmp_path / 'sub' / 'b.blob'}: missing"]
    note = cacheseal.verify_or_reset(tmp_path)
    assert note and note.startswith("compiled cache rebuilt, not loaded") and list(tmp_path.iterdir()) == []


def test_files_without_a_seal_are_foreign(tmp_path):
    (tmp_path / "x.blob").write_bytes(b"1")
    assert "without a valid seal" in cacheseal.problems(tmp_path)[0]
    (tmp_path / cacheseal.SEAL).write_text("{not json")
    assert "without a valid seal" in cacheseal.problems(tmp_path)[0]
    assert cacheseal.verify_or_reset(tmp_path) and not (tmp_path / "x.blob").exists()
    assert cacheseal.verify_or_reset(tmp_path) is None  # an empty directory is a clean start


def test_serving_rebuilds_a_corrupted_openvino_cache_and_never_loads_it(tmp_path):
    pytest.importorskip("openvino")
    pkg = rm.classifier_package(tmp_path / "pkg", sets=2)
    cache = tmp_path / "cache"
    entry = SlotEntry(
        version="1",
        sha256=SHA,
        provider="openvino",
        package_dir=str(pkg),
        model_path=str(pkg / "model.onnx"),
        cache_dir=str(cache),
    )
    first: dict = {}
    open_and_warm(entry, timings=first).close()
    blobs = [p for p in cache.rglob("*") if p.is_file() and p.name != cacheseal.SEAL]
    assert blobs, "OpenVINO wrote no compiled blob into CACHE_DIR"
    assert "cache_rebuilt" not in first and cacheseal.problems(cache) == []
    sealed = json.loads((cache / cacheseal.SEAL).read_text())["files"]
    victim = blobs[0]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # one flipped byte in the middle of the compiled blob
    victim.write_bytes(bytes(data))
    again: dict = {}
    session = open_and_warm(entry, timings=again)
    try:
        assert "content differs from its sealed sha256" in again["cache_rebuilt"]
        assert again["first_answer_s"] >= again["session_s"] > 0
    finally:
        session.close()
    assert cacheseal.problems(cache) == []  # rebuilt and sealed again
    if victim.exists():  # the runtime wrote it anew: not the corrupted bytes
        assert victim.read_bytes() != bytes(data)
    assert json.loads((cache / cacheseal.SEAL).read_text())["files"].keys() == sealed.keys()


def test_serving_refuses_an_optimised_graph_that_fails_its_seal(tmp_path):
    from agent.errors import ModelError
    from agent.qualify.optimize import build

    pkg = rm.classifier_package(tmp_path / "pkg", sets=2)
    out = tmp_path / "optimized"
    out.mkdir()
    rec = next(r for r in build(model_path=str(pkg / "model.onnx"), out_dir=str(out), kinds=["ort-basic"]))
    entry = SlotEntry(
        version="1", sha256=SHA, provider="cpu", package_dir=str(pkg), model_path=rec["file"], optimization="ort-basic"
    )
    open_and_warm(entry).close()  # sealed when built: it serves
    with open(rec["file"], "ab") as f:
        f.write(b"\0")  # one byte more: still parses as ONNX, but not what was built and measured
    with pytest.raises(ModelError, match="is not loaded: .*content differs from its sealed sha256"):
        open_and_warm(entry)
