"""Ask the guard to trial an installed release (`edge-agent release activate`, and the daemon's own update from
the control plane, agent.services.release_update): each committed model's golden answer recorded from the running
agent first, then guard/request.json written."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError


class NotTrialable(EdgeAgentError):
    """The release is not installed, or is marked bad on this device."""


def ask(root: Path, state_dir: Path, version: str) -> dict[str, Any]:
    """{version, golden_models, skipped}; NotTrialable when the release is not installed or is marked bad."""
    from agent.release.golden import record
    from agent.util.atomic import atomic_write_json
    from agent_guard.links import is_bad

    if not (root / "releases" / version / "installed.json").is_file():
        raise NotTrialable(f"release {version} is not installed under {root}")
    if is_bad(root, version):
        raise NotTrialable(f"release {version} is marked bad on this device")
    golden = record(state_dir)
    atomic_write_json(root / "guard" / "golden.json", golden)
    atomic_write_json(root / "guard" / "request.json", {"version": version})
    return {"version": version, "golden_models": [m["name"] for m in golden["models"]], "skipped": golden["skipped"]}
