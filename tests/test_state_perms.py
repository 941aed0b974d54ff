"""State files are 0600 and directories 0700 whatever the umask (run outside systemd with umask 022)."""

from __future__ import annotations

import os
import stat

from support.agent import make_agent
from support.daemon import deploy


def test_state_files_0600_dirs_0700_under_umask_022(tmp_path):
    old = os.umask(0o022)
    try:
        a = make_agent(tmp_path, serve_http=False, known_providers=["cpu"], start=True)
        try:
            assert deploy(a, "1").state.value == "committed"
            a.write_status()
        finally:
            a.stop()
    finally:
        os.umask(old)
    state = tmp_path / "state"
    bad = []
    for dirpath, dirnames, filenames in os.walk(state):
        for name in dirnames + filenames:
            p = os.path.join(dirpath, name)
            mode = stat.S_IMODE(os.lstat(p).st_mode)
            if "inbox" in os.path.relpath(p, state).split(os.sep)[:1]:
                continue
            want = 0o700 if os.path.isdir(p) else 0o600
            if mode != want:
                bad.append(f"{os.path.relpath(p, state)} {oct(mode)}")
    assert stat.S_IMODE(state.stat().st_mode) == 0o700
    assert not bad, bad
