"""`edge-agent release build`: a wheelhouse for this platform (pip wheel of the edge-agent source, with every
dependency unless `--no-deps`), then its signed manifest (agent.release.manifest)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError
from agent.release import manifest


@dataclass(frozen=True)
class Built:
    out: Path
    version: str
    wheels: int
    size: int
    manifest: dict[str, Any]


def default_source() -> Path | None:
    """The source tree this agent runs from, when it is a checkout (has pyproject.toml)."""
    here = Path(__file__).resolve().parents[2]
    return here if (here / "pyproject.toml").is_file() else None


def build(src: Path, out: Path, key, *, deps: bool = True, find_links: tuple[str, ...] = ()) -> Built:
    """pip wheel SRC into OUT (replaced), sign its manifest. `deps=False`: only the edge-agent wheel; the release
    then installs over a base environment's packages (`release install --base-venv`)."""
    if out.exists():
        shutil.rmtree(out)
    out.mkdir(parents=True)
    cmd = [sys.executable, "-m", "pip", "wheel", "-q", "--no-build-isolation", "--wheel-dir", str(out), str(src)]
    if not deps:
        cmd.insert(5, "--no-deps")
    for link in find_links:
        cmd[5:5] = ["--find-links", link]
    done = subprocess.run(cmd, capture_output=True, text=True)
    if done.returncode != 0:
        raise EdgeAgentError(f"pip wheel failed ({done.returncode}): {done.stderr.strip()[-1500:]}")
    agent = [p for p in out.glob("*.whl") if manifest.wheel_name(p.name)[0] == "edge-agent"]
    if len(agent) != 1:
        raise EdgeAgentError(f"pip wheel made {len(agent)} edge-agent wheels in {out}")
    version = manifest.wheel_name(agent[0].name)[1]
    doc = manifest.make(out, version, dependencies="wheelhouse" if deps else "base", key=key)
    size = sum(w["size"] for w in doc["wheels"])
    return Built(out, version, len(doc["wheels"]), size, doc)
