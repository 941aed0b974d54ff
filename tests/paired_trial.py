"""A daemon-level paired trial (issue 36), shared by tests/test_paired_probation.py and bench/paired_verdicts.py
--daemon (no tests here): a DeviceAgent in-process (the daemon's own code: inbox, qualification, shadow, swap,
probation, rollback) over real HTTP with real ONNX Runtime sessions, version 1 committed, one client, then
version 2 (twice the compute when `redundant`), beside co-runners of a given kind:

- "none": nothing else started;
- "busy": two busy loops (`python3 -c 'while 1: pass'` x2);
- "hog": a memory-bandwidth hog (a numpy copy loop over 256 MB) pinned with `taskset` to the last core this
  process may use (os.sched_getaffinity); hog_core() says why not where fewer than 2 CPUs are usable."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
from probation_load import Load, body_for
from probation_models import chain_depth, chain_model
from support.agent import make_agent
from support.daemon import drop
from support.wait import wait_for

from agent.samples import write_package
from agent.trial.settings import ProbationConfig, ShadowConfig

LOADS = ("none", "busy", "hog")
HOG = (
    "import numpy as np\n"
    "a = np.ones(256 * 2**20 // 8); b = np.empty_like(a)\n"
    "while True: np.copyto(b, a); np.copyto(a, b)\n"
)


def hog_core() -> tuple[int | None, str]:
    """(the core to pin the hog to, '') or (None, why not)."""
    cpus = sorted(os.sched_getaffinity(0))
    if len(cpus) < 2:
        return None, f"the hog needs another core: this process may use {len(cpus)} CPU ({cpus})"
    return cpus[-1], ""


@contextlib.contextmanager
def corunners(kind: str) -> Iterator[list[subprocess.Popen]]:
    """The co-runners of `kind` running for the block, each ended by its own id afterwards."""
    procs: list[subprocess.Popen] = []
    try:
        if kind == "busy":
            procs = [subprocess.Popen([sys.executable, "-c", "while 1: pass"]) for _ in range(2)]
        elif kind == "hog":
            core, why = hog_core()
            assert core is not None, why
            procs = [subprocess.Popen(["taskset", "-c", str(core), sys.executable, "-c", HOG])]
        elif kind != "none":
            raise ValueError(f"unknown load {kind!r}: one of {LOADS}")
        if procs:
            time.sleep(1.0)  # the hog's 512 MB allocated and copying
            assert all(p.poll() is None for p in procs), "a co-runner died"
        yield procs
    finally:
        for p in procs:
            p.kill()
            p.wait()


def push(a: Any, version: str, model: Any) -> Any:
    """Drop a package into the inbox; the deployment once terminal."""
    drop(a.state_dir, version, writer=lambda d: write_package(d, model, name="tiny", version=version))

    def ended():
        done = [d for d in a.orchestrator.journal.all() if d.version == version and d.terminal]
        return done[-1] if done else None

    return wait_for(ended, 240, f"deployment of version {version}")


def daemon_trial(tmp_path: Path, redundant: bool, ms: float = 1.0) -> tuple[Any, Any, dict, list[str]]:
    """Version 1 (a chain of about `ms` CPU ms a run on this host), one client, then version 2: (agent, the
    deployment, the status document, the client's errors). The windows are the shortest the judge allows here:
    probation 3 s watched on up to 10 windows while the pairs are not judged, paired_share 0.5 (enough pairs within
    that on a shared host; the default is 0.1)."""
    shadow = ShadowConfig(requests=10, duration_s=10, min_requests=5, max_latency_ratio=100.0)
    probation = ProbationConfig(extend=10.0, paired_share=0.5)  # 6: 11 pairs in 18 s once at a load average of 10
    a = make_agent(tmp_path, probation_s=3.0, shadow=shadow, probation=probation, start=True)
    load = None
    try:
        depth = chain_depth(tmp_path, ms)
        assert push(a, "1", chain_model(depth=depth, bias=1.0)).state.value == "committed"
        x = np.random.default_rng(1).standard_normal((1, 1024)).astype(np.float32)
        load = Load(a.url, "tiny", [body_for("x", x)], clients=1).start()
        load.wait_requests(50)
        dep = push(a, "2", chain_model(depth=depth, redundant=redundant, bias=1.0))
        load.wait_requests(10)
        status = a.status()
    finally:
        if load:
            load.stop()
        a.stop()
    return a, dep, status, load.errors if load else ["no load"]


def paired_of(dep: Any) -> dict[str, Any]:
    """The paired block that decided: probation's, or the shadow's where the pairs ended the trial there."""
    probation = dep.data.get("probation")
    if isinstance(probation, dict) and isinstance(probation.get("paired"), dict):
        return probation["paired"]
    return dep.data["shadow"]["paired"]
