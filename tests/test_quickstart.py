"""scripts/quickstart.sh end to end (MQTT with a private Mosquitto, and local inbox mode): it deploys, serves
one correct inference, prints the decision with evidence, and leaves no process or directory behind."""

from __future__ import annotations

import contextlib
import json
import os
import re
import socket
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# the script waits up to its QUICKSTART_TIMEOUT (600 s) per step; at load 20 on 2 cores the whole run took over 300 s
pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


# the defaults of the agent's HTTP and gRPC fronts, MQTT and the control plane
DEFAULT_PORTS = (8080, 8001, 1883, 8470)


@contextlib.contextmanager
def holding(ports):
    """Real listening sockets on `ports` while the block runs (a port something else already listens on is held
    already)."""
    held = []
    try:
        for port in ports:
            s = socket.socket()
            try:
                s.bind(("127.0.0.1", port))
                s.listen()
                held.append(s)
            except OSError:
                s.close()
        yield
    finally:
        for s in held:
            s.close()


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
    with holding(DEFAULT_PORTS):  # every port the script uses is chosen free, not a default someone else holds
        r = subprocess.run(args, capture_output=True, text=True, timeout=1500, env=env, cwd=tmp_path)
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
    # the README names what this machine kind prints (the case the installed runtimes report): the usable providers
    # and the same provider rows (provider, precision, status, coverage); latency figures are this run's own
    case = readme_case(*host_case())
    assert re.search(r"^    usable providers here: (.*)$", out, re.M).group(1) == case["providers"], out[-3000:]
    got = re.findall(r"^    (\S+)\s+(\S+)\s+(passed|failed)\s+(\S+)\s+\S+\s+[\d.]+\s+[\d.]+\s", out, re.M)
    assert sorted(case["rows"]) == sorted(got), (case, got)
    assert_columns_aligned(out)
    assert re.search(r"selected: [\w.:-]+ .*: ", out)  # names like ort-openvino
    assert "everything the quickstart started is stopped" in out
    for pid in map(int, re.findall(r"(?:agent|artifact server|mosquitto) pid (\d+)", out)):
        assert not alive(pid), f"pid {pid} still running"
    assert not list(tmp_path.glob("edge-agent-quickstart.*"))  # work directory removed


def assert_columns_aligned(out: str) -> None:
    """The decision table's columns are as wide as their widest cell: each provider row's PROVIDER, PRECISION and
    STATUS cells start where their headers do (`ort-openvino f32` once ran into the next column)."""
    lines = out.splitlines()
    at = next(i for i, line in enumerate(lines) if line.lstrip().startswith("PROVIDER "))
    header = lines[at]
    starts = [header.index(h) for h in ("PROVIDER", "PRECISION", "STATUS")]
    rows = [line for line in lines[at + 1 :] if re.match(r"^    \S+\s+\S+\s+(passed|failed)\s", line)]
    assert rows, out[-3000:]
    for row in rows:
        for col in starts:
            assert row[col] != " " and row[col - 1] == " ", (header, row)


def host_case() -> tuple[str, str]:
    """What the installed runtimes report on this host: the precision OpenVINO's CPU plugin defaults to (bf16 where
    the CPU has avx512_bf16 or AMX; read from OpenVINO, not from the CPU's flags) and the providers that opened a
    session here (`edge-agent providers --json`, available = a session opened), in the target's order."""
    import openvino as ov

    from agent.providers.openvino import precision_name

    precision = precision_name(ov.Core().get_property("CPU", "INFERENCE_PRECISION_HINT"))
    r = subprocess.run(
        [sys.executable, "-m", "agent", "providers", "--json"], capture_output=True, text=True, timeout=300
    )
    assert r.returncode == 0, r.stderr[-2000:]
    return precision, ", ".join(p["name"] for p in json.loads(r.stdout) if p["available"])


def readme_cases() -> list[dict]:
    """README.md's "What the quickstart shows" table: one row per machine kind with OpenVINO's CPU default
    precision, the `usable providers here:` line and the provider rows `provider precision status coverage`."""
    readme = (ROOT / "README.md").read_text().split("## What the quickstart shows", 1)[1].split("\n## ", 1)[0]
    cases = []
    for kind, precision, providers, rows in re.findall(r"^\| (.+?) \| (\w+) \| `([^`]+)` \| (.+) \|$", readme, re.M):
        rows = re.findall(r"`(\S+) (\S+) (passed|failed) (\S+)`", rows)
        cases.append({"kind": kind, "precision": precision, "providers": providers, "rows": rows})
    return cases


def readme_case(precision: str, providers: str) -> dict:
    """The README's case for what this host's runtimes report (a new machine kind fails here, naming itself)."""
    found = [c for c in readme_cases() if (c["precision"], c["providers"]) == (precision, providers)]
    assert len(found) == 1, (
        f"README.md's quickstart table names no (or more than one) case for OpenVINO CPU default {precision} with "
        f"usable providers {providers!r}: {readme_cases()}"
    )
    return found[0]


def test_readme_names_this_host_case():
    """The README has a row for what the runtimes report here, and that row is consistent with it: one provider
    row per usable provider, OpenVINO's at its reported default precision."""
    precision, providers = host_case()
    case = readme_case(precision, providers)
    assert [r[0] for r in case["rows"]] == providers.split(", "), case
    assert ("openvino", precision) in [r[:2] for r in case["rows"]], case


def test_readme_cases_are_distinct_and_complete():
    """The comparison above can fail: the table names the three machine kinds seen (AVX2-only AMD, AMD with
    avx512_bf16, Intel with AMX and the OpenVINO EP plugin), each with a row per usable provider."""
    cases = readme_cases()
    keys = [(c["precision"], c["providers"]) for c in cases]
    assert len(set(keys)) == len(keys) == 3, cases
    assert set(keys) == {("f32", "openvino, cpu"), ("bf16", "openvino, cpu"), ("bf16", "openvino, ort-openvino, cpu")}
    for c in cases:
        assert [r[0] for r in c["rows"]] == c["providers"].split(", "), c
        assert dict(r[:2] for r in c["rows"])["openvino"] == c["precision"], c
        assert all(r[2] == "passed" and r[3] == "100%" for r in c["rows"]), c


def test_readme_block_is_one_of_the_cases():
    """The printed example above the table is the output of the case it says it is (providers line and rows)."""
    readme = (ROOT / "README.md").read_text().split("## What the quickstart shows", 1)[1].split("\n## ", 1)[0]
    block = readme.split("```", 2)[1]
    providers = re.search(r"^    usable providers here: (.*)$", block, re.M).group(1)
    rows = re.findall(r"^    (\S+)\s+(\S+)\s+(passed|failed)\s+(\S+)\s", block, re.M)
    shown = [c for c in readme_cases() if "(the block above)" in c["kind"]]
    assert len(shown) == 1 and shown[0]["providers"] == providers and shown[0]["rows"] == rows, (shown, rows)


def test_quickstart_names_an_agent_that_died(tmp_path):
    """The agent dies mid-deployment (SIGKILL right after journaling `qualifying`, the daemon's test hook): the
    script stops waiting at once and says which process exited, with the last lines of its log, instead of polling
    a dead process until QUICKSTART_TIMEOUT (600 s) runs out."""
    env = dict(
        os.environ,
        EDGE_AGENT_VENV=sys.prefix,
        TMPDIR=str(tmp_path),
        EDGE_AGENT_PROBATION_S="1",
        EDGE_AGENT_QUALIFY_BUDGET_S="0.5",
        EDGE_AGENT_TEST_CRASH_AT="qualifying",
    )
    r = subprocess.run(
        ["bash", str(ROOT / "scripts/quickstart.sh"), "--local"],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
        cwd=tmp_path,
    )
    out = r.stdout + r.stderr
    assert r.returncode == 1, out[-3000:]
    m = re.search(r"quickstart\.sh: error: the agent \(pid (\d+)\) exited", out)
    assert m, out[-3000:]
    assert "--- agent.log (last 30 lines) ---" in out and "ready url=http://127.0.0.1:" in out
    assert "timed out" not in out and "was not committed" not in out
    assert not alive(int(m.group(1)))
    assert not list(tmp_path.glob("edge-agent-quickstart.*"))  # work directory removed
