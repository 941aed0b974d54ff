"""`edge-agent qualify` as a user runs it: pinned JSON, human table with reasons, clean errors."""

from __future__ import annotations

import json

import pytest
from clirunner import edge_agent


def test_qualify_json_is_the_pinned_document(cnn_package, tmp_path):
    saved = tmp_path / "decision.json"
    p = edge_agent(
        "qualify",
        str(cnn_package),
        "--provider",
        "cpu",
        "--provider",
        "openvino",
        "--json",
        "--budget",
        "0.2",
        "--save",
        str(saved),
    )
    assert p.returncode == 0, p.stderr
    doc = json.loads(p.stdout)
    assert {"sha256", "name", "version", "path"} <= set(doc["model"])
    assert doc["selected"] in ("cpu", "openvino")
    keys = {r["provider"] for r in doc["results"]}
    assert {"cpu", "openvino"} <= keys
    for r in doc["results"]:
        assert r["status"] in ("passed", "failed", "unavailable", "error")
        assert {"provider", "status", "reason", "precision", "coverage", "accuracy", "latency_ms"} <= set(r)
        if r["status"] == "passed":
            assert {"p50", "p90", "p99"} <= set(r["latency_ms"])
    assert "qualify: cpu" in p.stderr  # progress goes to stderr, JSON alone to stdout
    assert json.loads(saved.read_text())["selected"] == doc["selected"]


def test_qualify_human_output_explains_the_decision(ml_package):
    p = edge_agent("qualify", str(ml_package), "--provider", "openvino", "--provider", "cpu", "--budget", "0.2")
    assert p.returncode == 0, p.stderr
    assert "PROVIDER" in p.stdout and "P99ms" in p.stdout
    assert "selected: cpu" in p.stdout
    assert "openvino: failed" in p.stdout and "Scaler" in p.stdout


@pytest.mark.parametrize("content", [b"not an onnx model at all \xff\xfe", None])
def test_corrupt_or_missing_model_is_one_line(tmp_path, content):
    path = tmp_path / "m.onnx"
    if content is not None:
        path.write_bytes(content)
    p = edge_agent("qualify", str(path))
    assert p.returncode != 0
    lines = p.stderr.strip().splitlines()
    # one error line, last; before it at most the progress line a slow start says (within 0.5 s of the start)
    assert lines[-1].startswith("error: ") and "Traceback" not in p.stderr, p.stderr
    assert all(ln.startswith("qualify: reading ") for ln in lines[:-1]), p.stderr


def test_nothing_passes_exits_3_with_selected_null(tmp_path):
    from agent import samples

    pkg = samples.write_package(tmp_path / "p", samples.ml_model(), name="ml")
    p = edge_agent("qualify", str(pkg), "--provider", "openvino", "--json")
    assert p.returncode == 3
    assert json.loads(p.stdout)["selected"] is None
