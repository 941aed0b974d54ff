"""`edge-agent profile`: show what this device is (or a captured sysroot) and which target it matches."""

from __future__ import annotations

import json
import os
import tempfile

import click

from agent.errors import ConfigError

GIB = 1 << 30


@click.command("profile")
@click.option(
    "--sysroot",
    metavar="DIR",
    default=None,
    help="Profile a captured device tree (a directory, the .tar.gz that scripts/capture-sysroot.sh "
    "writes, or the name of a capture shipped in agent/sysroots) instead of this machine.",
)
@click.option("--json", "as_json", is_flag=True, help="Print the profile as JSON (the pinned keys).")
def profile(sysroot: str | None, as_json: bool) -> None:
    """Show this device's hardware profile and matching target.

    Reads /proc, /sys, /etc and /dev only (sysctl on macOS); with --sysroot, nothing about
    the hardware is read from this machine. Fields that cannot be read are null and a note says why.

    \b
    Examples:
      edge-agent profile
      edge-agent profile --json | jq .accelerators
      edge-agent profile --sysroot jetson-orin-nano-jp6      (a capture shipped with the package)
      sh scripts/capture-sysroot.sh pi.tar.gz && edge-agent profile --sysroot pi.tar.gz
    """
    prof = detect_profile(sysroot)
    if as_json:
        click.echo(json.dumps(prof.to_dict(), indent=2))
        return
    from agent.cli.table import render_fields

    click.echo(render_fields(summary_rows(prof)))


def detect_profile(sysroot: str | None):
    """The profile of this host, or of a captured sysroot (directory, capture tarball, or the name of a shipped
    capture); ConfigError if none of these."""
    from agent import sysroots as captures
    from agent.hardware.sysroot import unpack_capture
    from agent.targets import detect_device as detect

    if sysroot is None:
        return detect("/")
    if os.path.isdir(sysroot):
        return detect(sysroot)
    if os.path.isfile(sysroot):
        with tempfile.TemporaryDirectory(prefix="edge-agent-sysroot-") as tmp:
            return detect(unpack_capture(sysroot, tmp))
    if os.path.lexists(sysroot):
        raise ConfigError(
            f"--sysroot {sysroot}: not a directory or a capture tarball (.tar.gz from capture-sysroot.sh)"
        )
    if sysroot in captures.names():
        return detect(captures.path(sysroot))
    raise ConfigError(f"--sysroot {sysroot}: no such directory or capture tarball")


def summary_rows(prof) -> list[tuple[str, str]]:
    """(label, text) rows of the human summary; one value per row, notes last."""
    cpu = prof.cpu
    cpu_text = cpu.model or cpu.vendor or "unknown"
    if cpu.vendor and cpu.model and cpu.vendor.lower() not in cpu.model.lower():
        cpu_text = f"{cpu.vendor} {cpu.model}"
    if cpu.cores:
        cpu_text += f", {cpu.cores} logical CPUs"
    board = prof.board
    board_text = "unknown"
    if board and (board.model or board.vendor):
        board_text = board.model or board.vendor
        if board.vendor and board.model and board.vendor.lower() not in board.model.lower():
            board_text += f" ({board.vendor})"
    rows = [
        ("arch", prof.arch or "unknown"),
        ("os", prof.os or "unknown"),
        ("board", board_text),
        ("soc", prof.soc or "-"),
        ("cpu", cpu_text),
        ("memory", f"{prof.memory_bytes / GIB:.1f} GiB" if prof.memory_bytes else "unknown"),
    ]
    accels = [f"{a.kind} {a.vendor}: {a.name}" + (f" [{a.device}]" if a.device else "") for a in prof.accelerators]
    rows += [("accelerators" if i == 0 else "", text) for i, text in enumerate(accels or ["none found"])]
    software = {k: v for k, v in prof.software.items() if k != "dt_compatible"}
    rows.append(("software", ", ".join(f"{k} {_fmt(v)}" for k, v in software.items()) or "-"))
    rows.append(("throttling", _throttling_text(prof.throttling)))
    rows.append(("target", prof.target or "none"))
    features = _features(prof)
    if features:
        rows.append(("features", " ".join(features)))
    rows += [("notes" if i == 0 else "", f"- {n}") for i, n in enumerate(prof.notes)]
    return rows


def _features(prof) -> list[str]:
    """What hwtests may select on for this device (target software features + confirmed hardware)."""
    if not prof.target:
        return []
    from agent.targets import features_for, get_target

    try:
        return sorted(features_for(prof, get_target(prof.target)))
    except Exception:  # noqa: BLE001 - the summary must print even if targets changed underneath
        return []


def _fmt(value) -> str:
    if isinstance(value, bool):
        return "yes" if value else "no"
    return str(value)


def _throttling_text(throttling) -> str:
    if not throttling:
        return "unknown"
    parts = []
    if "raw" in throttling:
        active = [k for k, v in throttling.items() if v is True]
        parts.append(f"{', '.join(active) if active else 'ok'} ({throttling['raw']})")
    temps = throttling.get("temperatures_c") or {}
    if temps:
        hottest = sorted(temps.items(), key=lambda kv: -kv[1])[:3]
        parts.append("hottest " + ", ".join(f"{name} {deg:.1f} °C" for name, deg in hottest))
    return "; ".join(parts) or "unknown"
