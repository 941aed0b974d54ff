"""Attestor: the device signs its qualification decision and its trial verdict as in-toto Statements (DSSE,
the device's own Ed25519 key), keeps them under state_dir/attestations/ and hands them to a publisher (MQTT:
retained on {p}/devices/{id}/attestations/{model}/{kind})."""

from __future__ import annotations

import json
import os
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.evidence import statement as st
from agent.evidence.dsse import sign_envelope

Publish = Callable[[str, str, bytes], None]  # (model, kind, envelope bytes)


class Attestor:
    def __init__(self, state_dir: str | os.PathLike, device_id: str, key=None, publish: Publish | None = None):
        from agent.artifacts.keys import device_key, key_id

        self.root = Path(state_dir) / "attestations"
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self.device_id = device_id
        self.key = key if key is not None else device_key(state_dir)
        self.key_id = key_id(self.key.public_key())
        self.publish = publish

    def path(self, dep_id: str, kind: str) -> Path:
        return self.root / f"{dep_id}.{kind}.intoto.json"

    def qualification(self, dep, decision: dict[str, Any]) -> Path:
        pred = st.qualification_predicate(self.device_id, self.key_id, _dep(dep), decision)
        return self._sign(dep, "qualification", pred)

    def trial(self, dep, verdict: str, reason: str | None) -> Path:
        figures = {k: dep.data[k] for k in ("shadow", "probation", "selected") if isinstance(dep.data.get(k), dict)}
        pred = st.trial_predicate(self.device_id, self.key_id, _dep(dep), verdict, reason, figures)
        return self._sign(dep, "trial", pred)

    def _sign(self, dep, kind: str, predicate: dict[str, Any]) -> Path:
        from agent.util.atomic import atomic_write_bytes

        digests = {}
        sig = dep.data.get("model_signature")
        if isinstance(sig, dict) and sig.get("manifest_sha256"):
            digests["model-signing-manifest-sha256"] = sig["manifest_sha256"]
        subject = st.subject(dep.model, str(dep.data.get("sha256") or ""), digests)
        body = _compact(st.statement(subject, st.KINDS[kind], predicate))
        data = _compact(sign_envelope(body, self.key))
        path = self.path(dep.id, kind)
        atomic_write_bytes(path, data, mode=0o600)
        if self.publish is not None:
            self.publish(dep.model, kind, data)
        return path

    def files(self) -> list[Path]:
        return sorted(self.root.glob("*.intoto.json"))


def _dep(dep) -> dict[str, Any]:
    return {"id": dep.id, "model": dep.model, "version": dep.version}


def _compact(doc: dict[str, Any]) -> bytes:
    """Sorted keys, no spaces: every byte of the file is significant."""
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()
