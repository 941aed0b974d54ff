"""Conformance: another device's report as columns, a readable pass matrix, model budgets, ETA, reference reuse,
and a SIGTERM that leaves no worker behind."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from html.parser import HTMLParser

import psutil
import pytest

from agent.conformance.compare import include, load_report
from agent.conformance.report import Report, write_all
from agent.conformance.runner import run_conformance
from agent.errors import EdgeAgentError
from agent.hardware.profile import CpuInfo, HardwareProfile
from agent.isolate.runner import FAULT_ENV
from agent.targets import get_target

PROFILE = HardwareProfile(arch="x86_64", os="Linux", cpu=CpuInfo(vendor="AuthenticAMD", model="test", cores=2))
PATTERNS = ["test_relu*", "test_softmax_*", "test_reduce_mean*"]


@pytest.fixture(scope="module")
def two_runs():
    """cpu here, and openvino's default-precision run dressed as another device's `cpu` report."""
    target = get_target("generic-x86_64")
    here = run_conformance("onnx-node", ["cpu"], profile=PROFILE, target=target, patterns=PATTERNS)
    there = run_conformance("onnx-node", ["openvino"], profile=PROFILE, target=target, patterns=PATTERNS)
    doc = there.to_dict()
    doc["cases"] = [{**c, "provider": "cpu"} for c in doc["cases"] if c["provider"] == "openvino"]
    doc["variants"] = {"cpu": doc["variants"]["openvino"]}
    doc.update(target="some-board", emulated="qemu-user:test", hardware={"arch": "aarch64", "cpu": "X", "board": "B"})
    return here, doc


def test_an_included_report_is_a_column_and_its_differences_are_exact(two_runs, tmp_path):
    here, other = two_runs
    report = Report(suite=here.suite, cases=list(here.cases), variants=dict(here.variants), meta=dict(here.meta))
    label = include(report, other, source="other.json")
    assert label == "some-board-emulated"
    key = f"cpu@{label}"
    counts = report.counts()
    assert counts[key]["total"] == len(other["cases"]) and counts["cpu"]["total"] == len(here.cases)
    a = {c["case"]: c["status"] for c in here.cases}
    b = {c["case"]: c["status"] for c in other["cases"]}
    differ = sorted(n for n in a if a[n] != b.get(n, a[n]))
    d = report.platform_differences()[key]
    assert d["cases"] == len(a) and d["differ"] == len(differ) and d["same"] == len(a) - len(differ)
    assert [e["case"] for e in d["examples"]] == differ
    assert sum(d["flips"].values()) == len(differ)
    assert report.precision_differences() == here.precision_differences()  # columns from elsewhere are not variants
    paths = write_all(report, tmp_path / "out")
    doc = json.loads(paths["json"].read_text())
    assert doc["included"][0]["label"] == label and doc["platform_differences"][key]["differ"] == len(differ)
    html = paths["html"].read_text()
    assert f"@{label}" in html and "aarch64 emulated" in html
    assert f"<b>{len(differ)}</b> differ" in html


class _Cells(HTMLParser):
    """Text of every pass-matrix cell, by (row header, column index)."""

    def __init__(self):
        super().__init__()
        self.rows: dict[str, list[str]] = {}
        self._in_matrix = self._cell = False
        self._row: list[str] = []
        self._op = ""
        self._text = ""

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table" and a.get("class") == "matrix":
            self._in_matrix = True
        elif self._in_matrix and tag in ("td", "th"):
            self._cell, self._text = True, ""

    def handle_endtag(self, tag):
        if not self._in_matrix:
            return
        if tag == "table":
            self._in_matrix = False
        elif tag in ("td", "th") and self._cell:
            self._cell = False
            self._row.append(self._text.strip())
        elif tag == "tr":
            if self._row:
                self.rows[self._row[0]] = self._row[1:]
            self._row = []

    def handle_data(self, data):
        if self._cell:
            self._text += data


def test_the_pass_matrix_shows_counts_as_text_at_a_readable_size(two_runs, tmp_path):
    here, _ = two_runs
    html = write_all(here, tmp_path / "out")["html"].read_text()
    parser = _Cells()
    parser.feed(html)
    assert "operator" in parser.rows  # the header row
    for op in {c["op"] for c in here.cases}:
        cases = [c for c in here.cases if c["op"] == op]
        passed = sum(c["status"] == "passed" for c in cases)
        assert parser.rows[op] == [f"{passed}/{len(cases)}"], op
    css = re.search(r"table\.matrix\{[^}]*font-size:(\d+)px", html)
    assert css and int(css.group(1)) >= 12
    assert "font-size='9'" not in html


@pytest.mark.parametrize(
    "content, why",
    [
        (b"not json", "not a conformance report.json"),
        (b"[1, 2]", "no 'cases' list"),
        (b'{"cases": [{"suite": "onnx-node"}], "variants": {}}', "cases[0] lacks"),
    ],
)
def test_with_report_refuses_what_is_not_a_report(tmp_path, content, why):
    p = tmp_path / "r.json"
    p.write_bytes(content)
    with pytest.raises(EdgeAgentError, match=re.escape(why)):
        load_report(p)
    out = tmp_path / "rep"
    cmd = [sys.executable, "-m", "agent", "conformance", "--suite", "onnx-node", "-k", "test_relu", "--out", str(out)]
    r = subprocess.run(cmd + ["--with-report", str(p)], capture_output=True, text=True, timeout=120)
    assert r.returncode == 2 and why in r.stderr and not out.exists()


def test_an_oversized_report_is_refused_before_it_is_read(tmp_path):
    p = tmp_path / "huge.json"
    with open(p, "wb") as f:
        f.truncate(300 * 2**20)  # sparse: costs nothing on disk
    with pytest.raises(EdgeAgentError, match="larger than a conformance report"):
        load_report(p)


def test_models_suite_budget_skips_rows_with_the_reason_and_reports_an_eta(tmp_path):
    from agent import samples
    from agent.conformance.models import run_models

    pkgs = [samples.sample_tiny_package(tmp_path / f"t{i}", name=f"t{i}", version="1") for i in range(3)]
    events = []
    cases, records = run_models(
        pkgs,
        PROFILE,
        get_target("generic-x86_64"),
        ["cpu", "openvino"],
        budget_s=0.05,
        model_budget_s=0.0,
        progress=lambda e, **f: events.append((e, f)),
    )
    assert len(records) == 3 and {c["status"] for c in cases} == {"skipped"}
    assert all("time budget" in c["reason"] for c in cases)
    models = [f for e, f in events if e == "model"]
    assert [m["index"] for m in models] == [1, 2, 3]
    assert models[0]["eta_s"] is None and all(m["eta_s"] is not None and m["eta_s"] >= 0 for m in models[1:])


def test_reference_outputs_are_reused_from_the_cache(tmp_path):
    from agent import samples
    from agent.qualify.harness import qualify
    from agent.qualify.options import QualifyOptions

    pkg = samples.write_package(tmp_path / "cnn", samples.cnn_model(), name="cnn", golden=False)
    target = get_target("generic-x86_64")
    options = QualifyOptions(cache_dir=tmp_path / "cache", latency_budget_s=0.05)
    first, second = (qualify(pkg, PROFILE, target, providers=["cpu"], options=options) for _ in range(2))
    assert first.reference == "onnx-reference-evaluator" and second.reference == "onnx-reference-evaluator (reused)"
    assert first.results[0].status == second.results[0].status == "passed"
    assert first.results[0].accuracy["max_rel"] == second.results[0].accuracy["max_rel"]


def _workers(pid: int) -> list[psutil.Process]:
    try:
        kids = psutil.Process(pid).children(recursive=True)
    except psutil.NoSuchProcess:
        return []
    return [k for k in kids if "agent.isolate.worker" in " ".join(k.cmdline())]


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGKILL])
def test_a_stopped_conformance_run_leaves_no_worker_behind(tmp_path, sig):
    env = {**os.environ, FAULT_ENV: "hang:cpu/test_relu"}  # the worker is busy (sleeping) when the signal comes
    cmd = [sys.executable, "-m", "agent", "conformance", "--suite", "onnx-node", "--provider", "cpu", "-k", "test_relu"]
    proc = subprocess.Popen(cmd + ["--out", str(tmp_path / "r")], env=env, stderr=subprocess.PIPE, text=True)
    deadline = time.monotonic() + 120
    workers: list[psutil.Process] = []
    while not workers and time.monotonic() < deadline and proc.poll() is None:
        workers = _workers(proc.pid)
        time.sleep(0.1)
    assert workers, "no worker started"
    time.sleep(1.0)  # let it reach the hanging task
    proc.send_signal(sig)
    rc = proc.wait(60)
    assert rc == (128 + sig if sig == signal.SIGTERM else -sig)
    gone, alive = psutil.wait_procs(workers, timeout=30)
    assert not alive, [p.pid for p in alive]


def test_every_provider_count_is_explained_by_causes():
    target = get_target("generic-x86_64")
    report = run_conformance(
        "onnx-node", ["cpu", "tensorrt"], profile=PROFILE, target=target, patterns=["test_cast_*", "test_relu"]
    )
    explained = report.explanations()
    for key, c in report.counts().items():
        for status in ("failed", "errored", "skipped"):
            assert sum((explained.get(key) or {}).get(status, {}).values()) == c[status], (key, status)
    assert explained["tensorrt"]["skipped"] == {"provider unavailable here": report.counts()["tensorrt"]["total"]}
    assert "(other)" not in " ".join(explained["cpu"].get("errored", {}))  # the cast errors have a named cause


def test_from_report_rewrites_a_report_with_another_devices_columns(two_runs, tmp_path):
    here, other = two_runs
    write_all(here, tmp_path / "here")
    (tmp_path / "other.json").write_text(json.dumps(other))
    r = subprocess.run(
        [sys.executable, "-m", "agent", "conformance", "--from-report", str(tmp_path / "here" / "report.json")]
        + ["--with-report", str(tmp_path / "other.json"), "--out", str(tmp_path / "both"), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert r.returncode == 0, r.stderr
    doc = json.loads((tmp_path / "both" / "report.json").read_text())
    assert doc["providers"]["cpu"] == here.counts()["cpu"]  # nothing ran again
    assert doc["providers"]["cpu@some-board-emulated"]["total"] == len(other["cases"])
    assert json.loads(r.stdout)["platform_differences"]["cpu@some-board-emulated"]["cases"] == len(here.cases)
