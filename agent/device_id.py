"""The stable default device id: board serial, else /etc/machine-id; never random per start."""

from __future__ import annotations

import os
import re
from pathlib import Path


def default_device_id(root: str | os.PathLike = "/") -> tuple[str, str] | None:
    """A stable id for this device and where it came from: the board serial (survives re-flashing, unlike a
    cloned image's machine-id), else /etc/machine-id. Never random. None when nothing stable is found."""
    root = Path(root)
    serial = _read(root / "proc/device-tree/serial-number")
    if serial:
        return _format_id(serial), "/proc/device-tree/serial-number"
    for line in (_read(root / "proc/cpuinfo") or "").splitlines():
        key, _, val = line.partition(":")
        if key.strip() == "Serial" and val.strip().strip("0"):
            return _format_id(val.strip()), "/proc/cpuinfo Serial"
    mid = _read(root / "etc/machine-id")
    if mid and re.fullmatch(r"[0-9a-fA-F]{32}", mid) and mid.strip("0"):
        return f"edge-{mid[:12].lower()}", "/etc/machine-id"
    return None


def _format_id(serial: str) -> str:
    clean = re.sub(r"[^A-Za-z0-9]", "", serial).lower()
    return f"edge-{clean[-16:]}"


def _read(path: Path) -> str | None:
    try:
        return path.read_bytes().replace(b"\0", b"").decode("ascii", "replace").strip() or None
    except OSError:
        return None
