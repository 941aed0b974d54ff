"""The one way tests run the edge-agent CLI: a real child process (`python -m agent`), output captured as text."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
EXE = [sys.executable, "-m", "agent"]


def edge_agent(
    *args: object,
    timeout: float = 300,
    env: dict[str, str] | None = None,
    cwd: str | os.PathLike | None = None,
    input: str | None = None,  # noqa: A002 - subprocess's own name
) -> subprocess.CompletedProcess:
    """Run `edge-agent ARGS...` from the repository root (or cwd) with extra environment; never raises on exit."""
    return subprocess.run(
        EXE + [str(a) for a in args],
        cwd=cwd if cwd is not None else ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env={**os.environ, **(env or {})},
        input=input,
        check=False,
    )
