"""Ten real-model packages dropped into a daemon's inbox at once (issue 11's first "Done when"): the pip-shipped
OCR detector, recognizer and classifier and two silero-vad builds, magika, skl2onnx with and without ZipMap,
onnxruntime's logreg_iris and an int8 QDQ classifier with its fp32 original. The real daemon process qualifies
them in isolated workers on every provider the target lists, one at a time. Every package that `edge-agent
qualify` passes alone goes live and answers over HTTP within its row's tolerance of plain onnxruntime; the
others are refused with the remedy; nothing ends "process died"; no two qualification windows overlap.

The verdicts below are those of standalone `edge-agent qualify PACKAGE` on this machine (bench/bench_realmodels.py
prints both side by side). With EDGE_AGENT_REALMODELS_TABLE=FILE the run's verdict table is written there."""

from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from support.daemon import Daemon, drop, write_config
from test_daemon_qualify import _results, _windows
from test_realmodels_daemon import infer

from agent.package.inputs import load_dataset
from agent.package.load import load_package

ROOT = Path(__file__).resolve().parent.parent
rp = pytest.importorskip("realmodels_pip")
try:
    rp.shipped_file("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx")
    rp.shipped_file("silero_vad", "data/silero_vad.onnx")
except FileNotFoundError as exc:  # scripts/test.sh installs them (tests/requirements-models.txt)
    pytest.skip(str(exc), allow_module_level=True)

# Standalone `edge-agent qualify` on each: these pass (some provider selected), these are refused (ZipMap).
PASSES = {"ocr-det", "ocr-rec", "ocr-cls", "silero-vad", "silero-vad-half", "magika", "skl-logreg", "qdq-int8"}
REFUSED = {"skl-zipmap", "ort-logreg-iris"}


def _served_matches_plain_onnxruntime(url: str, name: str, pkg_dir: Path, row: dict) -> None:
    pkg = load_package(pkg_dir)
    feeds, _ = load_dataset(pkg.datasets[0], pkg.inputs, pkg.outputs)
    served = infer(url, name, feeds)
    plain = ort.InferenceSession(str(row["model_path"]), providers=["CPUExecutionProvider"])
    expected = dict(zip([o.name for o in plain.get_outputs()], plain.run(None, feeds)))
    tol = row["accuracy"]["tolerance"]
    for out, want in expected.items():
        got = served[out]
        assert got.shape == want.shape, (name, out, got.shape, want.shape)
        scale = float(np.abs(want).max()) if want.size else 0.0
        bound = (tol["max_abs"] or 0) + (tol["max_rel"] or 0) * scale
        err = float(np.abs(got.astype(np.float64) - want.astype(np.float64)).max())
        assert err <= bound, (name, out, row["key"], err, bound)


@pytest.mark.field
@pytest.mark.timeout(1200)  # it waits up to 900 s for the ten (55 s on a quiet 2-core host, more beside a build)
def test_ten_real_models_dropped_at_once(tmp_path):
    makers = rp.ten_makers(sorted((ROOT / "agent" / "qualify").glob("*.py"))[:6])
    assert len(makers) == 10 and set(makers) == PASSES | REFUSED
    made = tmp_path / "made"
    for name, make in makers.items():
        make(made / name)
    cfg = write_config(tmp_path)
    state = tmp_path / "state"
    # every provider the target lists (EDGE_AGENT_QUALIFY_PROVIDERS empty), isolated workers as in the field
    d = Daemon(cfg, state, env={"EDGE_AGENT_QUALIFY_ISOLATE": "1", "EDGE_AGENT_QUALIFY_PROVIDERS": ""})
    try:
        d.wait_ready()
        import shutil

        for name in makers:
            drop(state, "1", name=name, writer=lambda p, src=made / name: shutil.copytree(src, p))
        deps = _results(d, list(makers), timeout=900)
        table = rp.render_table(rp.verdict_rows(state))
        print(table)
        if os.environ.get("EDGE_AGENT_REALMODELS_TABLE"):
            Path(os.environ["EDGE_AGENT_REALMODELS_TABLE"]).write_text(table + "\n")

        for name in REFUSED:
            reason = deps[name]["reason"] or ""
            assert deps[name]["result"] == "failed" and "options={'zipmap': False}" in reason, (name, reason)
            assert ".py:" not in reason and "Error:" not in reason, reason  # the user's words, no class name
        records = {}
        for f in (state / "deployments").glob("*.json"):
            rec = json.loads(f.read_text())
            records[rec["model"]] = rec
        for name in PASSES:
            assert deps[name]["result"] == "committed", (name, deps[name], table)
            decision = json.loads((state / "decisions" / f"{records[name]['id']}.json").read_text())
            row = next(r for r in decision["results"] if r["key"] == decision["selected_key"])
            _served_matches_plain_onnxruntime(d.url, name, made / name, row)
            status = d.status()["models"][name]
            assert status["provider"] == row["provider"] and status["precision"] == row["precision"], name

        log = d.log.read_text()
        assert "process died" not in log and not any("process died" in (v.get("reason") or "") for v in deps.values())
        windows = _windows(log)
        assert len(windows) == 2 * len(makers), windows  # each takes its turn, the refused ones too
        for i in range(0, len(windows), 2):  # start, end of the same model, never interleaved
            assert windows[i][1] == "start" and windows[i + 1] == (windows[i][0], "end"), windows
        spans = sorted(
            (r["data"]["qualification"]["started"], r["data"]["qualification"]["finished"])
            for r in records.values()
            if r["data"].get("qualification")
        )
        assert len(spans) == len(PASSES) and all(a[1] <= b[0] for a, b in zip(spans, spans[1:])), spans
    finally:
        assert d.terminate() == 0, d.tail()
