"""Is this process running under an emulator (qemu-user)? Latency measured there is not evidence."""

from __future__ import annotations

import os
import platform
from collections.abc import Mapping
from pathlib import Path

MARKER_ENV = "EDGE_AGENT_EMULATED"  # set by scripts/emulated-device.sh, e.g. "qemu-user:pi4"


def detect_emulation(environ: Mapping[str, str] | None = None, binfmt_dir: str | Path | None = None) -> str | None:
    """A short description of the emulation ("qemu-user:pi4 (EDGE_AGENT_EMULATED)") or None when native.

    Signals, any one is enough: the marker our script sets; QEMU_CPU or QEMU_LD_PREFIX, which qemu-user
    reads and only an emulated userland needs; a binfmt_misc entry that hands this very architecture to
    qemu (Debian registers none for the native one, so such an entry means this interpreter is foreign)."""
    env = os.environ if environ is None else environ
    if env.get(MARKER_ENV):
        return env[MARKER_ENV]
    for var in ("QEMU_CPU", "QEMU_LD_PREFIX"):
        if env.get(var):
            return f"qemu-user ({var}={env[var]})"
    machine = platform.machine().lower().replace("arm64", "aarch64")
    entry = Path(binfmt_dir or "/proc/sys/fs/binfmt_misc") / f"qemu-{machine}"
    try:
        first = entry.read_text(errors="replace").splitlines()[:1]
    except OSError:
        return None
    if first and first[0].strip() == "enabled":
        return f"qemu-user (binfmt_misc {entry.name})"
    return None
