"""The guard's trial reports signed by the device key: the guard (standard library only) cannot sign Ed25519, so
the agent signs each report it finds unsigned (agent.transport.signing.sign_doc, the key of its status and events)
and keeps the signed copy beside it (guard/reports/<name>.signed.json)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.util.atomic import atomic_write_json, read_json


def sign_reports(root: Path, state_dir: Path) -> list[dict[str, Any]]:
    """Every report, signed (signing those not signed yet); oldest first."""
    from agent.artifacts.keys import device_key
    from agent.transport.signing import sign_doc

    key = device_key(state_dir)
    out = []
    for path in sorted((root / "guard" / "reports").glob("*.json")):
        if path.name.endswith(".signed.json"):
            continue
        signed_path = path.with_name(path.stem + ".signed.json")
        try:
            signed = read_json(signed_path, default=None)
            if signed is None:
                signed = sign_doc({**read_json(path), "signed": True}, key)
                atomic_write_json(signed_path, signed, mode=0o600)
        except (OSError, ValueError, TypeError):
            continue  # a report being written, or damaged: not signed, not listed
        out.append(signed)
    return out
