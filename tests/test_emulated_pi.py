"""An emulated Raspberry Pi 4 and 5 (scripts/emulated-device.sh: Debian bookworm arm64 under qemu-user, the project
installed by install.sh --no-systemd, a captured board's /proc and /sys): profile, providers, qualify, the daemon
over MQTT from the host, and the node conformance suite beside this host's.

The rootfs is built on first use (a few minutes; cached under /var/cache/edge-agent-emu). These tests skip only
when this host cannot run arm64 binaries at all (not root, no binfmt_misc, no mount namespaces); a missing package
is a failure, since scripts/test.sh installs qemu-user-static, binfmt-support and debootstrap.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from support.daemon import EXE, ROOT, infer, wait_for
from support.mqtt import register_device

from agent import sysroots as captures

SCRIPT = ROOT / "scripts" / "emulated-device.sh"
FIXTURES = captures.root()  # the device captures: package data (agent/sysroots)
BOARDS = {"pi4": ("raspberry-pi-4", "rpi4-4gb"), "pi5": ("raspberry-pi-5", "rpi5-8gb")}
# The node-suite slice run on the emulated Pi and on this host (onnx 1.23: 94 of its 1,884 cases): the operators a
# CNN's numerics live in (Conv, ConvTranspose, ConvInteger, Gemm, MatMul, MatMulInteger, Softmax, Exp) and the
# casts from float, where an Arm build's conversions differ first. Running them under emulation takes seconds; what
# took this test 277 s was onnx generating all 1,884 cases under qemu first (now the host's are shared, see
# _shared_node_cases), so the slice is not cut further. The whole suite on Arm: docs/emulated-device.md.
NODE_SUBSET = ["test_conv*", "test_gemm*", "test_matmul*", "test_softmax*", "test_exp*", "test_cast_FLOAT*"]

pytestmark = [pytest.mark.slow, pytest.mark.field, pytest.mark.timeout(3600)]


def _host_problem() -> str | None:
    if not sys.platform.startswith("linux"):
        return f"emulated devices need Linux (binfmt_misc); this is {sys.platform}"
    r = subprocess.run(["bash", str(SCRIPT), "--check"], capture_output=True, text=True, timeout=300)
    if r.returncode == 3:
        return r.stderr.strip()
    assert r.returncode == 0, f"emulated-device.sh --check failed (setup missing?): {r.stderr}"
    return None


@pytest.fixture(scope="session")
def boards():
    """Both boards built (or found in the cache) and installed from this checkout; {board: seconds it took}."""
    why = _host_problem()
    if why:
        pytest.skip(why)
    took, t0 = {}, time.monotonic()
    # Both at once: the shared stages are built once (under the script's lock), then each board's install.sh
    # (single-threaded emulated pip) runs beside the other's.
    cmd = ["nice", "-n", "10", "bash", str(SCRIPT)]
    pipes = {"stdout": subprocess.PIPE, "stderr": subprocess.PIPE, "text": True, "start_new_session": True}
    procs = {b: subprocess.Popen([*cmd, b], **pipes) for b in BOARDS}
    try:
        for board, p in procs.items():
            out, err = p.communicate(timeout=3000)
            assert p.returncode == 0, f"building the {board} rootfs failed:\n{err[-4000:]}"
            took[board] = time.monotonic() - t0
            print(f"emulated {board}: ready in {took[board]:.0f} s ({out.strip()})", file=sys.stderr)
            for line in err.splitlines():  # the script's stage timings, for the lane's log (-rP)
                if " in " in line and line.rstrip().endswith(" s"):
                    print(line, file=sys.stderr)
    finally:
        for p in procs.values():
            if p.poll() is None:  # the other board failed: stop this one's install too, children and all
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
    return took


def emu(board: str, *cmd: str, cwd: Path | None = None, timeout: float = 900, check: bool = True, env=None):
    r = subprocess.run(
        ["nice", "-n", "10", "bash", str(SCRIPT), board, *cmd],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=cwd or ROOT,
        env=env,
    )
    if check:
        assert r.returncode == 0, f"{board} {' '.join(cmd)} -> {r.returncode}\n{r.stderr[-4000:]}"
    return r


def _fixture(board: str, rel: str) -> str:
    return (FIXTURES / BOARDS[board][1] / rel).read_bytes().decode(errors="replace")


def _target_memory_max(name: str) -> str:
    import yaml

    return str(yaml.safe_load((ROOT / "targets" / f"{name}.yaml").read_text())["serving"]["memory_max"])


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_installed_like_a_pi_and_profiled_as_one(boards, board):
    target = BOARDS[board][0]
    assert emu(board, "uname", "-m").stdout.strip() == "aarch64"
    r = emu(board, "sh", "-c", "command -v edge-agent; cat /etc/systemd/system/edge-agent.service.d/10-device.conf")
    assert r.stdout.splitlines()[0] == "/opt/edge-agent/venv/bin/edge-agent"  # install.sh's venv, not this checkout
    assert f"target {target}" in r.stdout and f"MemoryMax={_target_memory_max(target)}" in r.stdout
    doc = json.loads(emu(board, "edge-agent", "profile", "--json").stdout)
    cpuinfo, meminfo = _fixture(board, "proc/cpuinfo"), _fixture(board, "proc/meminfo")
    mem_kb = next(int(ln.split()[1]) for ln in meminfo.splitlines() if ln.startswith("MemTotal:"))
    assert doc["target"] == target and doc["arch"] == "aarch64"
    assert doc["cpu"]["cores"] == sum(ln.startswith("processor") for ln in cpuinfo.splitlines())
    assert doc["memory_bytes"] == mem_kb * 1024
    assert doc["board"]["model"] == _fixture(board, "proc/device-tree/model").rstrip("\0")
    throttled = next((FIXTURES / BOARDS[board][1] / "sys/devices/platform").rglob("get_throttled")).read_text().strip()
    assert int(doc["throttling"]["raw"], 16) == int(throttled, 16)


@pytest.mark.parametrize("board", sorted(BOARDS))
def test_providers_find_cpu_and_openvino_and_explain_the_rest(boards, board):
    rows = {p["name"]: p for p in json.loads(emu(board, "edge-agent", "providers", "--json").stdout)}
    assert rows["cpu"]["available"] and rows["openvino"]["available"], rows
    assert rows["cpu"]["opened"] and rows["openvino"]["opened"]  # a session opened on the (emulated) device
    assert rows["openvino"]["devices"] == ["CPU"]
    fp16 = "asimdhp" in _fixture(board, "proc/cpuinfo")  # Cortex-A76 (Pi 5) has it, A72 (Pi 4) does not
    assert ("default precision f16" in rows["openvino"]["reason"]) == fp16
    for name in ("acl", "xnnpack"):
        p = rows[name]
        assert not p["available"] and "not in this onnxruntime build" in p["reason"], p
        assert "build onnxruntime from source" in p["remedy"], p
    assert not rows["ort-openvino"]["available"] and "aarch64" in rows["ort-openvino"]["reason"]


def _qualify(board: str, pkg: Path, tmp_path: Path, providers: tuple[str, ...] = ("cpu", "openvino")) -> dict:
    out = tmp_path / f"{board}-decision.json"
    args = [a for p in providers for a in ("--provider", p)] + ["--budget", "0.3", "--save", str(out)]
    r = emu(board, "edge-agent", "qualify", str(pkg), *args, cwd=tmp_path, check=False)
    assert r.returncode in (0, 3), r.stderr[-4000:]
    return json.loads(out.read_text())


def test_qualify_on_pi4_measures_cpu_and_openvino_on_a_cnn_labelled_emulated(boards, tmp_path):
    from agent.samples import sample_cnn_package

    doc = _qualify("pi4", sample_cnn_package(tmp_path / "cnn"), tmp_path)
    rows = {r["key"]: r for r in doc["results"]}
    assert set(rows) == {"cpu", "openvino"}, rows.keys()
    for r in rows.values():
        assert r["status"] == "passed", r
        assert r["emulated"] and r["latency_ms"]["emulated"] is True and r["latency_ms"]["runs"] > 0
        assert r["coverage"] == 1.0
    assert rows["openvino"]["precision"] == "f32"  # Cortex-A72 has no fp16 arithmetic
    assert doc["emulated"].startswith("qemu-user:pi4")
    assert "emulation" in doc["reason"] and "fastest" not in doc["reason"]  # no latency claim
    assert doc["hardware"]["arch"] == "aarch64"


def test_qualify_on_pi5_records_openvino_f16_and_requalifies_at_f32(boards, tmp_path):
    """A package whose own tolerance f16 cannot meet: the f16 row fails accuracy, f32 is measured, both kept."""
    from agent.samples import cnn_model, write_package

    tight = {"tolerances": {"openvino:f16": {"max_rel": 1.0e-5}}}
    pkg = write_package(tmp_path / "cnn-tight", cnn_model(), name="cnn-tight", extra_yaml=tight)
    doc = _qualify("pi5", pkg, tmp_path)
    rows = {r["key"]: r for r in doc["results"]}
    assert set(rows) == {"cpu", "openvino", "openvino:f32"}, rows.keys()
    f16, f32 = rows["openvino"], rows["openvino:f32"]
    assert f16["precision"] == "f16" and f16["requested_precision"] is None  # the runtime's own default
    assert f16["status"] == "failed" and f16["stage"] == "accuracy", f16
    assert f16["accuracy"]["max_rel"] > f16["accuracy"]["tolerance"]["max_rel"]
    assert f32["precision"] == "f32" and f32["status"] == "passed", f32
    assert f32["accuracy"]["max_rel"] < f16["accuracy"]["max_rel"]
    assert all(r["emulated"] for r in rows.values())


def test_qualify_on_pi5_by_its_target_alone_measures_openvino(boards, tmp_path):
    """No --provider: the target's list orders, it does not decide what is measured (issue 22, item 5)."""
    from agent.samples import sample_cnn_package

    doc = _qualify("pi5", sample_cnn_package(tmp_path / "cnn"), tmp_path, providers=())
    rows = {r["key"]: r for r in doc["results"]}
    assert rows["openvino"]["precision"] == "f16" and rows["openvino"]["status"] in ("passed", "failed"), rows
    if rows["openvino"]["status"] == "failed":  # f16 missed the tolerance: f32 was measured
        assert rows["openvino:f32"]["precision"] == "f32"
    assert rows["cpu"]["status"] == "passed"
    assert rows["xnnpack"]["status"] == rows["acl"]["status"] == "unavailable"


def test_qualify_on_pi5_runs_a_generative_package_through_onnxruntime_genai(boards, tmp_path):
    """Issue 39: onnxruntime-genai 0.18 has Linux aarch64 wheels (CPython 3.11-3.14, manylinux_2_28; bookworm has
    3.11 and glibc 2.36), so on the emulated Pi 5 its rows are measured and judged; OpenVINO GenAI (installed there
    too: the next test) says why it has no row of this package: its model is onnxruntime-genai's layout."""
    from agent.generative.samples import write_generative_package

    pkg = write_generative_package(tmp_path / "tiny-lm", variants=("perturbed",), max_length=128)
    with (pkg / "model.yaml").open("a") as f:  # fewer timed runs than the defaults: qemu runs them ~20x slower
        f.write("timing: {prompt_lengths: [16, 64], tpot_tokens: 32, repeats: 3, greedy_tokens: 32}\n")
    out = tmp_path / "pi5-generative.json"
    r = emu(
        "pi5", "edge-agent", "qualify", str(pkg), "--provider", "cpu", "--save", str(out), cwd=tmp_path, check=False
    )
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(out.read_text())
    rows = {row["key"]: row for row in doc["results"]}
    ref, bad = rows["onnxruntime-genai/cpu:fp32"], rows["onnxruntime-genai/cpu:perturbed"]
    assert ref["status"] == "passed" and ref["fidelity"]["top1"] == 1.0, ref
    assert ref["tpot_ms"]["p50_ms"] > 0 and ref["peak_rss_bytes"] > 0
    assert bad["status"] == "failed" and bad["fidelity"]["top1"] < doc["gates"]["min_top1"], bad
    ov = rows["openvino-genai/-"]
    assert ov["status"] == "unavailable" and "holds a model for onnxruntime-genai" in ov["reason"] and ov["fix"], ov
    assert doc["selected"] == "onnxruntime-genai/cpu:fp32"
    assert doc["emulated"].startswith("qemu-user:pi5")  # its times are the emulator's: labelled in the record


def test_qualify_on_pi5_runs_a_generative_package_through_openvino_genai(boards, tmp_path):
    """Issue 39: OpenVINO GenAI 2026.4.1 has Linux aarch64 wheels (cp311 manylinux_2_31, with openvino-tokenizers)
    and the emulated Pi 5 has them: the same decoder in LLMPipeline's layout is measured through OpenVINO's Arm
    CPU plugin, the perturbed variant refused, GPU and NPU unavailable with why."""
    from agent.generative.samples import write_openvino_package

    timing = {"prompt_lengths": [8, 16], "tpot_tokens": 16, "repeats": 2, "greedy_tokens": 16}  # qemu: ~20x slower
    pkg = write_openvino_package(tmp_path / "tiny-ov", variants=("perturbed",), max_length=128, timing=timing)
    out = tmp_path / "pi5-ov-generative.json"
    r = emu("pi5", "edge-agent", "qualify", str(pkg), "--save", str(out), cwd=tmp_path, check=False)
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads(out.read_text())
    rows = {row["key"]: row for row in doc["results"]}
    ref, bad = rows["openvino-genai/CPU:fp32"], rows["openvino-genai/CPU:perturbed"]
    assert ref["status"] == "passed" and ref["fidelity"]["top1"] == 1.0, ref
    assert ref["tpot_ms"]["p50_ms"] > 0 and ref["peak_rss_bytes"] > 0 and ref["load_s"] > 0
    assert bad["status"] == "failed" and bad["fidelity"]["top1"] < doc["gates"]["min_top1"], bad
    for dev in ("GPU", "NPU"):
        row = rows[f"openvino-genai/{dev}:fp32"]
        assert row["status"] == "unavailable" and row["reason"] and row["fix"], row
    other = rows["onnxruntime-genai/-"]
    assert other["status"] == "unavailable" and "openvino-genai" in other["reason"], other
    assert doc["selected"].startswith("openvino-genai/CPU:") and rows[doc["selected"]]["status"] == "passed"
    assert doc["emulated"].startswith("qemu-user:pi5")


def _push(tmp_path: Path, broker, keyfile: Path, version: str) -> dict:
    from agent.samples import sample_tiny_package

    pkg = sample_tiny_package(tmp_path / f"pkg-{version}", version=version)
    cmd = EXE + ["fleet", "push", str(pkg), "--name", "tiny", "--version", version, "--device", "pi-1"]
    cmd += ["--key", str(keyfile), "--store", str(tmp_path / "cp-store"), "--broker", broker.url]
    cmd += ["--wait", "600", "--json"]
    out = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, timeout=700)
    assert out.stdout.strip(), out.stderr
    return json.loads(out.stdout)


def test_daemon_on_emulated_pi_pulls_from_host_mosquitto_serves_and_hot_swaps(boards, tmp_path, mosquitto):
    import yaml

    from agent.artifacts.keys import generate

    keyfile, pubfile, _ = generate(tmp_path / "keys")
    state = tmp_path / "dev" / "state"
    cfg = tmp_path / "dev" / "agent.yaml"
    cfg.parent.mkdir(parents=True)
    cfg.write_text(
        yaml.safe_dump(
            {
                "device_id": "pi-1",
                "state_dir": str(state),
                "target": "auto",
                "mqtt": {"url": mosquitto.url},  # 127.0.0.1: the host's loopback, seen from the chroot
                "trust": {"public_keys": [str(pubfile)]},
                # one request reaches v1 before the swap: its shadow phase would wait 30 s for more
                "serving": {"host": "127.0.0.1", "port": 0, "shadow": {"duration_s": 1.0}},
                "telemetry": {"interval_s": 0},
            }
        )
    )
    (tmp_path / "cp-store").mkdir()
    register_device(tmp_path / "cp-store", "pi-1", state)  # its key, registered: push --wait believes its reports
    server = subprocess.Popen(
        EXE + ["fleet", "serve", "--store", str(tmp_path / "cp-store"), "--broker", mosquitto.url],
        cwd=ROOT,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    log = tmp_path / "daemon.log"
    env = {
        **os.environ,
        "EDGE_AGENT_PROBATION_S": "0.5",
        "EDGE_AGENT_QUALIFY_PROVIDERS": "cpu",
        "EDGE_AGENT_QUALIFY_BUDGET_S": "0.1",
        "EDGE_AGENT_QUALIFY_ISOLATE": "0",  # the row inside the qualification process: one Python start less
    }
    with open(log, "ab") as f:
        daemon = subprocess.Popen(
            ["nice", "-n", "10", "bash", str(SCRIPT), "pi4", "edge-agent", "run", "--config", str(cfg)],
            cwd=tmp_path,
            env=env,
            stdout=f,
            stderr=subprocess.STDOUT,
        )

    def status():
        try:
            return json.loads((state / "status.json").read_bytes())
        except (OSError, ValueError):
            return None

    tail = lambda: log.read_text(errors="replace")[-4000:]  # noqa: E731
    try:
        doc = wait_for(lambda: (status() or {}).get("serving", {}).get("url") and status(), 600, "status", daemon)
        url = doc["serving"]["url"]
        assert doc["mode"] == "mqtt" and doc["target"] == "raspberry-pi-4", doc
        res = _push(tmp_path, mosquitto, keyfile, "1")
        assert res["ok"] and res["devices"]["pi-1"]["result"] == "committed", (res, tail())
        assert infer(url) == ("1", [1.0] * 4)
        res = _push(tmp_path, mosquitto, keyfile, "2")
        assert res["devices"]["pi-1"]["result"] == "committed", (res, tail())
        assert infer(url) == ("2", [2.0] * 4)  # hot-swapped on the same address
        st = wait_for(lambda: (status() or {}).get("models", {}).get("tiny", {}).get("version") == "2" and status())
        assert st["models"]["tiny"]["provider"] == "cpu"
    finally:
        if daemon.poll() is None:
            daemon.terminate()
        rc = daemon.wait(120)
        server.terminate()
        server.wait(30)
    assert rc == 0, tail()


def _shared_node_cases(tmp_path: Path) -> dict[str, str]:
    """The environment for both sides: EDGE_AGENT_CACHE_DIR holding this host's generated node cases, which the
    emulated Pi reads too (the script passes EDGE_AGENT_* in; tmp_path is inside the shared TMPDIR). Same onnx,
    numpy and ml_dtypes there (the wheels follow the host venv's versions): the same cases, byte for byte, on
    both sides of the comparison, instead of onnx generating ~1,900 of them again under emulation (most of
    this test's 277 s). With another Python minor version on the host the Pi generates its own, as before."""
    from agent.conformance import node, nodecache

    cases = node._generated()  # this host's (from its own cache, else generated now)
    shared = tmp_path / "node-cases"
    shared.mkdir(mode=0o700)
    env = {**os.environ, "EDGE_AGENT_CACHE_DIR": str(shared)}
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("EDGE_AGENT_CACHE_DIR", str(shared))
        nodecache.load_or_generate(lambda: cases)
        kept = nodecache.cache_file()
    assert kept is not None and kept.is_file(), f"the node cases were not kept in {shared}"
    return env


def test_conformance_node_suite_on_arm_becomes_a_column_of_the_host_report(boards, tmp_path):
    ks = [a for k in NODE_SUBSET for a in ("-k", k)]
    env = _shared_node_cases(tmp_path)
    arm = tmp_path / "arm"
    cmd = ["edge-agent", "conformance", "--suite", "onnx-node", "--provider", "cpu", *ks, "--out", str(arm)]
    emu("pi4", *cmd, env=env)
    arm_doc = json.loads((arm / "report.json").read_text())
    assert arm_doc["hardware"]["arch"] == "aarch64" and arm_doc["emulated"].startswith("qemu-user:pi4")
    assert arm_doc["target"] == "raspberry-pi-4" and arm_doc["providers"]["cpu"]["total"] == arm_doc["node_cases"]

    host = tmp_path / "host"
    cmd = EXE + ["conformance", "--suite", "onnx-node", "--provider", "cpu", *ks, "--out", str(host)]
    r = subprocess.run(
        cmd + ["--with-report", str(arm / "report.json"), "--json"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    assert r.returncode == 0, r.stderr[-4000:]
    doc = json.loads((host / "report.json").read_text())
    col = "cpu@raspberry-pi-4-emulated"
    assert doc["providers"][col]["total"] == arm_doc["providers"]["cpu"]["total"]
    d = doc["platform_differences"][col]
    here = {c["case"]: c["status"] for c in doc["cases"] if c["provider"] == "cpu"}
    there = {c["case"]: c["status"] for c in arm_doc["cases"] if c["provider"] == "cpu"}
    differ = sorted(n for n in here if n in there and here[n] != there[n])
    assert d["cases"] == len(set(here) & set(there)) > 0
    assert d["differ"] == len(differ) and [e["case"] for e in d["examples"]] == differ[: len(d["examples"])]
    html = (host / "report.html").read_text()
    assert "@raspberry-pi-4-emulated" in html and "aarch64 emulated" in html and "against cpu on this host" in html
