"""hwtests/ is a real pytest suite: run a small slice of it the way a device would."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_hwtests_node_slice_runs_and_skips_by_feature():
    p = subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "hwtests",
            "-q",
            "-p",
            "no:cacheprovider",
            "--provider",
            "cpu",
            "--node-case",
            "test_relu*",
            "--node-case",
            "test_adagrad",
            "-k",
            "node_case or tensorrt",
            "-rs",
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=300,
    )
    out = p.stdout + p.stderr
    assert "passed" in out, out
    m = re.search(r"(\d+) failed, (\d+) passed", out)
    assert m and int(m.group(1)) == 1 and int(m.group(2)) >= 2, out  # test_adagrad: ORT has no training ops
    assert "test_node_case[cpu-test_adagrad]" in out
    assert "lacks feature(s): tensorrt" in out  # the TensorRT-only test is skipped by feature, with the reason
