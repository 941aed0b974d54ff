"""scripts/install.sh --root: a tree systemd-analyze verify accepts, idempotent, device-aware, uninstallable."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from agent.config import default_device_id, load_config

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/install.sh"
VENV = Path(sys.prefix)  # the venv running these tests: a real one with edge-agent installed
UNIT = "etc/systemd/system/edge-agent.service"
DROPIN = "etc/systemd/system/edge-agent.service.d/10-device.conf"
WANTS = "etc/systemd/system/multi-user.target.wants/edge-agent.service"


def install(root: Path, *args: str, check: bool = True) -> subprocess.CompletedProcess:
    r = subprocess.run(
        ["bash", str(SCRIPT), "--root", str(root), "--venv-dir", str(VENV), *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    if check:
        assert r.returncode == 0, r.stdout + r.stderr
    return r


def verify(unit: Path) -> str:
    """systemd-analyze verify prints 'ignoring' warnings but still exits 0: any output is a failure."""
    exe = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    r = subprocess.run([exe, "verify", str(unit)], capture_output=True, text=True, timeout=120)
    return (r.stdout + r.stderr).strip() + ("" if r.returncode == 0 else f"\n(exit {r.returncode})")


def snapshot(root: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(root)): (p.read_bytes() if p.is_file() and not p.is_symlink() else b"<dir/link>")
        for p in sorted(root.rglob("*"))
        if "/src/" not in str(p)
    }


def sysroot(root: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_text(text)
    return root


def test_tree_verifies_and_config_loads(tmp_path):
    root = tmp_path / "root"
    out = install(root).stdout
    for rel in (
        UNIT,
        DROPIN,
        "etc/edge-agent/agent.yaml",
        "var/lib/edge-agent",
        "var/cache/edge-agent",
        "opt/edge-agent/src/agent/config/__init__.py",
        "opt/edge-agent/src/targets/generic-x86_64.yaml",
    ):
        assert (root / rel).exists(), rel
    assert (root / WANTS).is_symlink() and str((root / WANTS).readlink()) == "/" + UNIT
    unit = (root / UNIT).read_text()
    assert f"ExecStart={VENV}/bin/edge-agent run --config /etc/edge-agent/agent.yaml" in unit
    for line in ("Type=notify", "NotifyAccess=main", "User=edge-agent", "ProtectSystem=strict", "WatchdogSec=30s"):
        assert line in unit
    assert verify(root / UNIT) == ""
    assert "MemoryMax=" in (root / DROPIN).read_text()
    with pytest.raises(Exception, match="device_id: not set and no stable id found"):
        load_config(root / "etc/edge-agent/agent.yaml", root=root)  # an empty image has no id yet...
    device = sysroot(tmp_path / "device", {"etc/machine-id": "0123456789abcdef0123456789abcdef\n"})
    cfg = load_config(root / "etc/edge-agent/agent.yaml", root=device)  # ...the device derives it at start-up
    assert cfg.mode == "local" and cfg.serving.port == 8080
    assert (cfg.device_id, cfg.device_id_source) == ("edge-0123456789ab", "/etc/machine-id")
    assert "[install] wrote" in out and "[install] enabled edge-agent.service" in out


def test_pi_sysroot_gets_its_id_target_and_groups(tmp_path):
    root = sysroot(
        tmp_path / "pi",
        {
            "proc/device-tree/model": "Raspberry Pi 4 Model B Rev 1.4\0",
            "proc/cpuinfo": "processor\t: 0\nCPU implementer\t: 0x41\nRevision\t: c03114\nSerial\t\t: 10000000abcdef01\n",
            "etc/group": "root:x:0:\nvideo:x:44:\nrender:x:105:\n",
        },
    )
    out = install(root).stdout
    assert "target: raspberry-pi-4 (detected); runtime: cpu" in out
    assert default_device_id(root) == ("edge-10000000abcdef01", "/proc/cpuinfo Serial")
    cfg = load_config(root / "etc/edge-agent/agent.yaml", root=root, check_files=False)
    assert cfg.device_id == "edge-10000000abcdef01" and cfg.device_id_source == "config"  # same as the agent's
    dropin = (root / DROPIN).read_text()
    assert "MemoryMax=75%" in dropin and "SupplementaryGroups=render video" in dropin
    assert verify(root / UNIT) == ""


def test_jetson_and_intel_pick_their_runtime(tmp_path):
    jet = sysroot(
        tmp_path / "jet",
        {
            "proc/device-tree/compatible": "nvidia,p3768-0000+p3767-0005\0nvidia,tegra234\0",
            "etc/nv_tegra_release": "# R36 (release), REVISION: 4.3\n",
        },
    )
    assert "target: jetson-orin (detected); runtime: jetson" in install(jet).stdout
    jp5 = sysroot(
        tmp_path / "jp5",
        {
            "proc/device-tree/compatible": "nvidia,p3701-0000\0nvidia,tegra234\0",
            "etc/nv_tegra_release": "# R35 (release), REVISION: 5.0\n",
        },
    )
    out = install(jp5).stdout
    assert "not JetPack 6" in out and "runtime: cpu" in out
    intel = sysroot(tmp_path / "nuc", {"proc/cpuinfo": "vendor_id\t: GenuineIntel\nflags\t: avx2 avx_vnni\n"})
    assert "target: intel-x86_64 (detected); runtime: openvino" in install(intel).stdout


def test_idempotent_and_keeps_edited_config(tmp_path):
    root = tmp_path / "root"
    install(root, "--device-id", "pi-kitchen-1")
    conf = root / "etc/edge-agent/agent.yaml"
    conf.write_text(conf.read_text().replace("interval_s: 60", "interval_s: 5"))
    first = snapshot(root)
    out = install(root, "--device-id", "ignored-now").stdout
    assert "kept existing" in out
    assert snapshot(root) == first  # a second run changes nothing (and never the operator's config)
    assert load_config(conf, check_files=False).telemetry.interval_s == 5.0
    assert load_config(conf, check_files=False).device_id == "pi-kitchen-1"


def test_uninstall_then_purge(tmp_path):
    root = tmp_path / "root"
    install(root)
    out = install(root, "--uninstall").stdout
    for rel in (UNIT, DROPIN, WANTS, "opt/edge-agent"):
        assert not (root / rel).exists() and not (root / rel).is_symlink(), rel
    assert (root / "etc/edge-agent/agent.yaml").exists() and (root / "var/lib/edge-agent").is_dir()
    assert "kept" in out
    install(root, "--uninstall", "--purge")
    assert not (root / "etc/edge-agent").exists() and not (root / "var/lib/edge-agent").exists()


def test_dry_run_and_bad_flags(tmp_path):
    root = tmp_path / "dry"
    out = install(root, "--dry-run").stdout
    assert "(dry-run)" in out and not root.exists()
    r = install(tmp_path / "x", "--frobnicate", check=False)
    assert r.returncode == 2 and "unknown option '--frobnicate'" in r.stderr
    r = install(tmp_path / "x", "--device-id", "a/b", check=False)
    assert r.returncode == 1 and "--device-id 'a/b'" in r.stderr
    r = install(tmp_path / "x", "--target", "toaster", check=False)
    assert r.returncode == 1 and "no " in r.stderr and "toaster.yaml" in r.stderr
    assert "--root DIR" in subprocess.run(["bash", str(SCRIPT), "--help"], capture_output=True, text=True).stdout


def test_unit_hardening_exposure(tmp_path):
    """`systemd-analyze security --offline` (systemd >= 250) rates the unit 2.0 or better ("OK")."""
    exe = shutil.which("systemd-analyze") or "/usr/bin/systemd-analyze"
    version = int(subprocess.run([exe, "--version"], capture_output=True, text=True).stdout.split()[1])
    unit = ROOT / "systemd/edge-agent.service"
    text = unit.read_text()
    for directive in (
        "NoNewPrivileges=yes",
        "ProtectSystem=strict",
        "ProtectHome=yes",
        "PrivateTmp=yes",
        "CapabilityBoundingSet=\n",
        "DevicePolicy=closed",
        "SystemCallFilter=@system-service",
        "RestrictAddressFamilies=AF_UNIX AF_INET AF_INET6 AF_NETLINK",
        "User=edge-agent",
    ):
        assert directive in text, directive
    if version >= 250:  # older analyzers have no --offline; the directives above are still checked
        r = subprocess.run(
            [exe, "security", "--offline=yes", "--threshold=20", str(unit)], capture_output=True, text=True, timeout=120
        )
        assert r.returncode == 0, r.stdout[-2000:] + r.stderr
        assert "Overall exposure level for edge-agent.service: 1." in r.stdout


@pytest.mark.parametrize(
    "files",
    [
        {"proc/device-tree/serial-number": "1423a0b7c9d8\0"},  # short Jetson-style serial
        {"proc/device-tree/serial-number": "QCS6490-00A1-B2C3-D4E5-F6071829\0"},  # long, punctuated
        {"proc/cpuinfo": "Serial\t\t: 10000000abcdef01\n"},
        {"proc/cpuinfo": "Serial\t\t: 0000000000000000\n", "etc/machine-id": "0123456789ABCDEF0123456789abcdef\n"},
    ],
    ids=["dt-short", "dt-long", "cpuinfo", "machine-id"],
)
def test_shell_device_id_matches_the_agent(tmp_path, files):
    root = sysroot(tmp_path / "dev", files)
    out = install(root, "--dry-run").stdout
    expected, _ = default_device_id(root)
    assert f"(device_id: {expected})" in out, out


def test_root_lays_out_the_first_release_side_by_side(tmp_path):
    """--release: the signed wheelhouse `edge-agent release build` makes, installed as releases/VERSION/venv (its
    signature checked with --trust), `current` naming it, the unit running current/venv, the guard beside."""
    keys, wheelhouse = tmp_path / "keys", tmp_path / "wh"
    cli = [sys.executable, "-m", "agent"]
    subprocess.run([*cli, "keys", "generate", "--out", str(keys)], check=True, capture_output=True)
    subprocess.run([*cli, "release", "build", "--out", str(wheelhouse), "--key", str(keys / "fleet.key"), "--no-deps"],
                   check=True, capture_output=True, cwd=ROOT)  # fmt: skip
    root = tmp_path / "root"
    out = install(root, "--release", str(wheelhouse), "--trust", str(keys / "fleet.pub")).stdout
    opt = root / "opt/edge-agent"
    assert (opt / "current").readlink() == Path("releases/0.1.0"), out
    assert (opt / "releases/0.1.0/installed.json").is_file() and (
        opt / "releases/0.1.0/wheelhouse/release.json"
    ).is_file()
    exe = opt / "current/venv/bin/edge-agent"
    env = {"PATH": "/usr/bin:/bin"}  # no PYTHONPATH: the release's own agent
    r = subprocess.run(
        [str(exe), "release", "list", "--root", str(opt), "--json"], capture_output=True, text=True, env=env
    )
    assert r.returncode == 0 and '"current": true' in r.stdout, (r.stdout, r.stderr)
    assert "ExecStart=/opt/edge-agent/current/venv/bin/edge-agent run" in (root / UNIT).read_text()
    guard_unit = root / "etc/systemd/system/edge-agent-guard.service"  # the guard as a unit, enabled, verified
    assert (root / "etc/systemd/system/multi-user.target.wants/edge-agent-guard.service").is_symlink(), out
    assert "--systemd edge-agent.service" in guard_unit.read_text() and verify(guard_unit) == ""
    guard = subprocess.run([sys.executable, "-S", "-I", str(opt / "guard/bin/edge-agent-guard"), "status", "--root",
                            str(opt), "--json"], capture_output=True, text=True)  # fmt: skip
    assert guard.returncode == 0 and '"current": "0.1.0"' in guard.stdout, guard.stderr
    again = install(root, "--release", str(wheelhouse), "--trust", str(keys / "fleet.pub")).stdout
    assert "release 0.1.0 already installed" in again  # idempotent

    other = tmp_path / "other"
    subprocess.run([*cli, "keys", "generate", "--out", str(other)], check=True, capture_output=True)
    r = install(tmp_path / "root2", "--release", str(wheelhouse), "--trust", str(other / "fleet.pub"), check=False)
    assert r.returncode != 0 and "is not signed by" in r.stderr, r.stdout + r.stderr
    assert not (tmp_path / "root2/opt/edge-agent/releases/0.1.0").exists()
