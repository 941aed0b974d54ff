"""scripts/quickstart.sh end to end (MQTT with a private Mosquitto, and local inbox mode): it deploys, serves
one correct inference, prints the decision with evidence, and leaves no process or directory behind."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
pytestmark = pytest.mark.slow


def alive(pid: int) -> bool:
    """Running (a zombie waiting for a reaper counts as stopped)."""
    try:
        return "State:\tZ" not in Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("mode", ["mqtt", "local"])
def test_quickstart(mode, tmp_path):
    env = dict(
        os.environ,
        EDGE_AGENT_VENV=sys.prefix,
        TMPDIR=str(tmp_path),
        PATH=f"{os.environ.get('PATH', '')}:/usr/sbin:/usr/local/sbin",
        # the daemon's own knobs (agent/cli/daemon.py): a 1 s probation and 0.5 s of timed runs per provider row
        # instead of the demo's 5 s each; every step and printed figure of the script stays the same
        EDGE_AGENT_PROBATION_S="1",
        EDGE_AGENT_QUALIFY_BUDGET_S="0.5",
    )
    args = ["bash", str(ROOT / "scripts/quickstart.sh")] + (["--local"] if mode == "local" else [])
    r = subprocess.run(args, capture_output=True, text=True, timeout=540, env=env, cwd=tmp_path)
    out = r.stdout + r.stderr
    assert r.returncode == 0, out[-4000:]
    if mode == "mqtt":
        assert "Private Mosquitto broker" in out and "quickstart-device: committed" in out
        assert re.search(r"mosquitto pid \d+", out)
        assert "registered quickstart-device (key " in out  # its own key, in the control plane's registry
        assert re.search(r"quickstart-device\s+yes\s+verified\s", out)  # fleet status believes its signed report
    else:
        assert "Local inbox mode" in out and "sample-cnn 1: committed" in out
    assert "-> model_version 1, output probabilities [1, 10]" in out
    m = re.search(r"predicted class (\d+) \(golden: (\d+)\)", out)
    assert m and m.group(1) == m.group(2)
    assert float(re.search(r"max \|output - golden reference\| = (\S+)", out).group(1)) < 1e-3
    assert re.search(r"^\s+cpu\s+f32\s+passed\s+100%", out, re.M)  # a decision row with its evidence
    # the README shows what a fresh clone prints on this machine kind: the usable providers and the same provider
    # rows (provider, precision, status, coverage); latency figures are this run's own
    shown_providers, shown_rows = readme_quickstart(bf16_cpu())
    assert re.search(r"^    usable providers here: (.*)$", out, re.M).group(1) == shown_providers, out[-3000:]
    got = re.findall(r"^    (\S+)\s+(\S+)\s+(passed|failed)\s+(\S+)\s+\S+\s+[\d.]+\s+[\d.]+\s", out, re.M)
    assert shown_rows and sorted(shown_rows) == sorted(got), (shown_rows, got)
    assert re.search(r"selected: [\w.:-]+ .*: ", out)  # names like ort-openvino
    assert "everything the quickstart started is stopped" in out
    for pid in map(int, re.findall(r"(?:agent|artifact server|mosquitto) pid (\d+)", out)):
        assert not alive(pid), f"pid {pid} still running"
    assert not list(tmp_path.glob("edge-agent-quickstart.*"))  # work directory removed


def bf16_cpu() -> bool:
    """Does the installed OpenVINO default to bf16 on this CPU (as it reports it, not read from the CPU's flags)?"""
    import openvino as ov

    from agent.providers.openvino import precision_name

    return precision_name(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT")) == "bf16"


def readme_quickstart(bf16: bool) -> tuple[str, list[tuple[str, ...]]]:
    """What README.md's "What the quickstart shows" says this machine kind prints: the usable providers line, and
    the provider rows (the block on a bf16 CPU; the sentence's rows `openvino f32 passed 100% ...` otherwise)."""
    readme = (ROOT / "README.md").read_text().split("## What the quickstart shows", 1)[1].split("\n## ", 1)[0]
    providers = re.search(r"^    usable providers here: (.*)$", readme, re.M).group(1)
    if bf16:
        rows = re.findall(r"^    (\S+)\s+(\S+)\s+(passed|failed)\s+(\S+)\s", readme, re.M)
    else:
        rows = re.findall(r"`(\S+) (\S+) (passed|failed) (\S+) [^`]*`", readme)
    return providers, rows


def test_readme_names_the_rows_of_both_cpu_kinds():
    """The comparison above can fail: both README variants name an OpenVINO and a CPU row, with their precision."""
    for bf16 in (True, False):
        providers, rows = readme_quickstart(bf16)
        assert providers == "openvino, cpu"
        assert sorted(r[:2] for r in rows) == [("cpu", "f32"), ("openvino", "bf16" if bf16 else "f32")], rows
