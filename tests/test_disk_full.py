"""A full state_dir at start-up degrades: the committed model serves, `disk_full` is in status and health; the
daemon never exits. Needs a small tmpfs (root with CAP_SYS_ADMIN); skipped where it cannot be mounted."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest
from support.agent import make_agent
from support.daemon import deploy


@pytest.fixture
def small_fs(tmp_path):
    mnt = tmp_path / "fs"
    mnt.mkdir()
    out = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=8m", "tmpfs", str(mnt)], capture_output=True)
    if out.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {out.stderr.decode().strip()}")
    try:
        yield mnt
    finally:
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def _fill(path: Path) -> None:
    with open(path, "wb") as f:
        try:
            while True:
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as exc:
            assert exc.errno == errno.ENOSPC


def _agent(root, events):
    extra = {"telemetry": {"interval_s": 0}}
    return make_agent(root, extra=extra, on_event=events.append, serve_http=False, known_providers=["cpu"])


def test_a_full_disk_at_start_up_keeps_serving_and_says_so(small_fs):
    root = small_fs / "dev"
    events: list[dict] = []
    a = _agent(root, events).start()
    try:
        assert deploy(a, "1").state.value == "committed"
    finally:
        a.stop()
    _fill(small_fs / "filler")
    b = _agent(root, events).start()  # must not raise
    try:
        version, _ = b.registry.infer("tiny", {"x": np.zeros((1, 4), np.float32)})
        assert str(version) == "1"
        doc = b.write_status()
        assert "No space left" in doc["disk_full"] and doc["models"]["tiny"]["version"] == "1"
        assert b.parts is not None and "disk_full" in b.parts.health.doc()
        assert any(e.get("disk_full") for e in events)
        os.unlink(small_fs / "filler")
        assert "disk_full" not in b.write_status()  # space again: reported cleared
    finally:
        b.stop()
