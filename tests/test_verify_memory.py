"""Packing, verification and unpacking stream: the daemon's peak RSS grows by less than 64 MB plus one chunk,
whatever the model's size (the ONNX checker, which holds the whole model, runs in a child process)."""

from __future__ import annotations

import json
import subprocess
import sys

from support.daemon import ROOT

SCRIPT = r"""
import json, sys
from pathlib import Path
import numpy as np
from onnx import TensorProto, helper, numpy_helper
from agent.artifacts.store import ContentStore
from agent.lifecycle.context import StepContext
from agent.lifecycle.stages.verify import verify
from agent.package.unpack import check_package
from agent.sources.inbox import fetch_inbox
from agent.isolate import runner  # imported before the measurement
from agent.package import load
from agent.samples import write_package

work, mib = Path(sys.argv[1]), int(sys.argv[2])
w = numpy_helper.from_array((np.arange(mib << 18, dtype=np.float32) % 251), "w")
graph = helper.make_graph(
    [helper.make_node("Add", ["x", "w"], ["y"])], "big",
    [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
    [helper.make_tensor_value_info("y", TensorProto.FLOAT, [mib << 18])], [w])
model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]); model.ir_version = 9
write_package(work / "pkg", model, name="big", golden=False)
del model, graph, w

def rss(field):
    for line in open("/proc/self/status"):
        if line.startswith(field):
            return int(line.split()[1]) * 1024

def measured(fn):
    open("/proc/self/clear_refs", "w").write("5")  # resets VmHWM to the current RSS
    before = rss("VmRSS:")
    value = fn()
    return value, rss("VmHWM:") - before

store = ContentStore(work / "state")
(work / "state" / "tmp").mkdir(parents=True, exist_ok=True)
ctx = StepContext(None)
got, pack_growth = measured(lambda: fetch_inbox(work / "pkg", store, work / "state" / "tmp", ctx))
res, verify_growth = measured(lambda: verify(store, got["sha256"], work / "state" / "packages", ctx))
size = Path(res["model_path"]).stat().st_size
_, inproc_growth = measured(lambda: check_package(res["package_dir"]))  # what verify cost before the child
print(json.dumps({"model_bytes": size, "pack_growth": pack_growth, "verify_growth": verify_growth,
                  "in_process_check_growth": inproc_growth}))
"""


def test_pack_verify_and_unpack_stay_under_64_mb_plus_a_chunk(tmp_path):
    out = subprocess.run(
        [sys.executable, "-c", SCRIPT, str(tmp_path), "160"], cwd=ROOT, capture_output=True, text=True, timeout=600
    )
    assert out.returncode == 0, out.stderr[-3000:]
    doc = json.loads(out.stdout.strip().splitlines()[-1])
    limit = (64 << 20) + (1 << 20)  # 64 MB plus one 1 MiB chunk
    assert doc["model_bytes"] > 160 << 20
    assert doc["pack_growth"] < limit, doc
    assert doc["verify_growth"] < limit, doc
    assert doc["in_process_check_growth"] > doc["model_bytes"]  # the measurement sees a whole-model load
    print(doc)
