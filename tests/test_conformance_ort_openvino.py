"""ort-openvino through the onnxruntime-ep-openvino plugin, many sessions in one process (a conformance worker's
life): every session is bound to the plugin, not only the first. Needs an Intel CPU: this host's when the plugin
enumerates one, else the one qemu-x86_64 presents (TCG reports GenuineIntel), else skipped with the reason.

The cases are generated here, natively, and handed to the child as the tasks a conformance worker receives (a
worker never generates cases either): generating onnx's ~1,900 node cases under qemu-x86_64's TCG, which the child
did when it loaded the three by name, took most of this test's 147 s."""

from __future__ import annotations

import json
import pickle
import platform
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hostruntime import ort_openvino_devices

from agent.conformance.node import load_cases, run_variant

ROOT = Path(__file__).resolve().parent.parent
CASES = ["test_abs", "test_add", "test_relu"]  # the first session always worked; the bug hit every later one
CHILD = """
import json, pickle, sys
from agent.conformance.nodetask import run_case
from agent.providers import get
from agent.hardware import detect
probe = get("ort-openvino").probe(detect("/"))
out = {"available": probe.available, "reason": probe.reason, "cases": {}}
with open(sys.argv[1], "rb") as f:
    tasks = pickle.load(f)
for task in tasks:
    out["cases"][task["name"]] = run_case(provider="ort-openvino", precision=None, options={}, **task)[:2]
print(json.dumps(out))
"""


def _intel_python() -> list[str]:
    if "CPU" in ort_openvino_devices():
        return [sys.executable]
    qemu = shutil.which("qemu-x86_64-static") or shutil.which("qemu-x86_64")
    if platform.machine() != "x86_64" or qemu is None:
        pytest.skip(
            "the OpenVINO EP plugin enumerates no Intel CPU here and qemu-x86_64 is not installed to present one"
        )
    return [qemu, "-cpu", "Icelake-Server", sys.executable]


@pytest.mark.field  # an Intel CPU presented by qemu-x86_64 where the host is not one
@pytest.mark.timeout(900)
def test_every_session_in_a_worker_is_bound_to_the_plugin(tmp_path):
    cases = load_cases(CASES)
    assert [c.name for c in cases] == CASES
    tasks = tmp_path / "tasks.pickle"
    tasks.write_bytes(pickle.dumps([c.task() for c in cases]))
    r = subprocess.run(
        [*_intel_python(), "-c", CHILD, str(tasks)],
        capture_output=True,
        text=True,
        timeout=800,
        cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads(r.stdout.strip().splitlines()[-1])
    assert doc["available"], doc["reason"]
    native = {x.case: x.status for x in run_variant(cases, "openvino", "f32")}
    got = {name: status for name, (status, _why) in doc["cases"].items()}
    assert got == native, {n: (got[n], native[n], doc["cases"][n][1]) for n in got if got[n] != native[n]}
    assert not any("fallback to CPU EP has been explicitly disabled" in why for _s, why in doc["cases"].values())
