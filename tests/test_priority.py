"""run_lowered: the build thread runs below serving priority; threads it leaves behind get their priority back."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from agent.util.priority import run_lowered

ROOT = Path(__file__).resolve().parent.parent


def _nice(tid: int | None = None) -> int:
    return os.getpriority(os.PRIO_PROCESS, tid or threading.get_native_id())


def _nice_or_none(tid: int) -> int | None:
    try:
        return _nice(tid)
    except OSError:
        return None


def test_runs_lowered_and_restores_threads_it_started():
    base = _nice()
    stop, started = threading.Event(), {}

    def build():
        t = threading.Thread(target=stop.wait, daemon=True)  # a runtime pool thread outliving the build
        t.start()
        started["tid"], started["nice"] = t.native_id, _nice(t.native_id)
        return _nice()

    try:
        seen, how = run_lowered(build, 7)
        assert seen == min(19, base + 7) and started["nice"] == seen  # inherited the low priority ...
        assert _nice(started["tid"]) == base  # ... and got it back after the build
        assert how == "nice +7"
    finally:
        stop.set()


def test_zero_runs_inline_and_errors_propagate():
    tid = threading.get_native_id()
    assert run_lowered(threading.get_native_id, 0) == (tid, "serving priority")
    with pytest.raises(ZeroDivisionError):
        run_lowered(lambda: 1 / 0, 5)


_BUILD = """
import json, os, sys, threading
import onnx
from agent.lifecycle.serve import warm_feeds
from agent.providers import get
from agent.samples import cnn_model
from agent.util import priority
provider, options, path = sys.argv[1], json.loads(sys.argv[2]), sys.argv[3]
onnx.save(cnn_model(), path)
get(provider)
base, before = os.getpriority(os.PRIO_PROCESS, 0), priority._threads()

def build():
    s = get(provider).open_session(path, options=options)
    s.run(warm_feeds(s)[0])
    return s

session, how = priority.run_lowered(build, 10)
for _ in range(20):  # serving-like work after the build: workers a runtime starts on demand (TBB) exist now
    session.run(warm_feeds(session)[0])
new = {}
for tid in priority._threads() - before:
    try:
        new[tid] = os.getpriority(os.PRIO_PROCESS, tid)
    except OSError:
        pass
print(json.dumps({"base": base, "how": how, "new": new}))
"""


@pytest.mark.parametrize("provider, options", [("cpu", {"intra_op_num_threads": 2}), ("openvino", {})])
def test_runtime_thread_pools_get_serving_priority_back(tmp_path, provider, options):
    """Real sessions built and warmed at nice +10 in a fresh process (an ORT intra-op pool of 2; OpenVINO's CPU
    streams and the TBB workers it starts, some of them late): no thread they start keeps the low priority."""
    import json

    out = _python("-c", _BUILD, provider, json.dumps(options), str(tmp_path / "cnn.onnx"), timeout=120)
    doc = json.loads(out.strip().splitlines()[-1])
    assert doc["how"] == "nice +10" and doc["new"], f"{provider} started no thread: the test proves nothing"
    assert {tid: n for tid, n in doc["new"].items() if n != doc["base"]} == {}


def _as_nobody(rlimit_nice: int) -> str:
    code = (
        "import resource, os, threading; from agent.util.priority import run_lowered;"  # imported while root
        f"resource.setrlimit(resource.RLIMIT_NICE, ({rlimit_nice}, {rlimit_nice})); os.setgid(65534); os.setuid(65534);"
        "print(run_lowered(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id()), 10))"
    )
    return _python("-c", code, timeout=60).strip()


def _python(*args: str, timeout: float) -> str:
    """A fresh interpreter on this checkout; its stdout (the test fails with its stderr when it fails)."""
    out = subprocess.run(
        [sys.executable, *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    assert out.returncode == 0, out.stderr
    return out.stdout


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_unprivileged_without_rlimit_nice_builds_at_serving_priority_and_says_why():
    out = _as_nobody(0)
    assert out.startswith("(0, \"cannot restore a thread's priority (Permission denied)") and "LimitNICE=+0" in out


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to drop to an unprivileged user")
def test_unprivileged_with_limitnice_builds_lowered():
    import resource

    if resource.getrlimit(resource.RLIMIT_NICE)[1] < 20:
        try:
            subprocess.run(
                [sys.executable, "-c", "import resource; resource.setrlimit(resource.RLIMIT_NICE, (20, 20))"],
                check=True,
                capture_output=True,
                timeout=30,
            )
        except subprocess.CalledProcessError:
            pytest.skip("this sandbox may not raise RLIMIT_NICE (no CAP_SYS_RESOURCE)")
    assert _as_nobody(20) == "(10, 'nice +10')"  # what the unit's LimitNICE=+0 grants
