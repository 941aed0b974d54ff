"""One light simulated device: its key, what it runs and the documents it sends, built with the device's own
signing code (agent.transport.signing, agent.transport.cpclient) and checked like a device checks (the desired
state's signature and targeting with agent.artifacts.manifest, each chunk against its manifest hash, the whole
artifact against its sha256). Nothing is run: a decision record says its figures were not measured."""

from __future__ import annotations

import hashlib
import json
import threading
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from agent.errors import ArtifactError

if TYPE_CHECKING:
    from agent.artifacts.manifest import Manifest
    from agent.artifacts.manifest.parts import Artifact

AGENT_VERSION = "light-sim"
NOT_MEASURED = "light simulator: nothing run, not measured"


@dataclass
class LightDevice:
    device_id: str
    key: Any  # Ed25519 private key, made in memory
    target: str
    groups: list[str]
    client: int  # which of the fleet's MQTT connections publishes for it
    provider: str = "CPUExecutionProvider"
    precision: str = "fp32"
    models: dict[str, dict[str, Any]] = field(default_factory=dict)
    deployments: dict[str, dict[str, Any]] = field(default_factory=dict)
    rejected: dict[str, dict[str, Any]] = field(default_factory=dict)
    seq: int = 0
    lock: threading.Lock = field(default_factory=threading.Lock)

    def status(self) -> bytes:
        """The signed retained status, as agent.transport.device.DeviceLink encodes it."""
        from agent.transport.signing import sign_doc

        doc = {
            "device_id": self.device_id,
            "online": True,
            "ts": time.time(),
            "groups": list(self.groups),
            "target": self.target,
            "agent_version": AGENT_VERSION,
            "providers": [self.provider],
            "hardware": {"simulated": "light"},
            "models": {m: dict(v) for m, v in self.models.items()},
            "deployments": {m: dict(v) for m, v in self.deployments.items()},
            "rejected": {m: dict(v) for m, v in self.rejected.items()},
        }
        return json.dumps(sign_doc(doc, self.key), sort_keys=True).encode()

    def next_seq(self) -> int:
        with self.lock:
            self.seq += 1
            return self.seq

    def decision(self, manifest: Manifest, deployment_id: str) -> dict[str, Any]:
        """The signed decision record of a deployment (agent.transport.cpclient.signed_document)."""
        from agent.transport.cpclient import signed_document

        row = {"key": "light", "provider": self.provider, "precision": self.precision, "status": "passed"}
        body = {
            "deployment_id": deployment_id,
            "model": manifest.name,
            "version": manifest.version,
            "artifact_sha256": manifest.artifact.sha256,
            "decision": {"results": [row], "selected": "light", "selected_precision": self.precision,
                         "reason": NOT_MEASURED},
        }  # fmt: skip
        return signed_document(self.device_id, self.key, body, self.next_seq())

    def on_probation(self, manifest: Manifest, deployment_id: str, probation_s: float) -> None:
        now = time.time()
        previous = (self.models.get(manifest.name) or {}).get("version")
        self.models[manifest.name] = {
            "version": manifest.version, "provider": self.provider, "precision": self.precision,
            "state": "probation", "probation_ends": now + probation_s, "sha256": manifest.artifact.sha256,
            **({"previous": previous} if previous and previous != manifest.version else {}),
        }  # fmt: skip
        self.deployments[manifest.name] = {
            "version": manifest.version, "state": "probation", "deployment_id": deployment_id, "ts": now,
        }  # fmt: skip
        self.rejected.pop(manifest.name, None)

    def commit(self, name: str, version: str) -> bool:
        """Probation over: committed (False when another version took its place meanwhile)."""
        model = self.models.get(name)
        if not model or model.get("version") != version or model.get("state") != "probation":
            return False
        model["state"] = "committed"
        model.pop("probation_ends", None)
        self.deployments[name].update(state="committed", result="committed", ts=time.time())
        return True

    def failed(self, name: str, version: str, reason: str) -> None:
        self.deployments[name] = {"version": version, "state": "failed", "result": "failed", "reason": reason,
                                  "ts": time.time()}  # fmt: skip

    def refuse(self, name: str, version: str | None, reason: str) -> None:
        self.rejected[name] = {"version": version, "reason": reason[:200], "ts": time.time()}


class ChunkCheck:
    """The chunks of one artifact as they arrive: each checked against its manifest hash, the whole against the
    artifact's sha256 once all are in (nothing kept on disk: the light device runs nothing)."""

    def __init__(self, artifact: Artifact) -> None:
        self.artifact = artifact
        self.have: dict[int, bytes] = {}
        self.bad = 0

    def missing(self) -> list[int]:
        return [i for i in range(len(self.artifact.chunks)) if i not in self.have]

    def take(self, index: int, body: bytes) -> None:
        if 0 <= index < len(self.artifact.chunks) and index not in self.have:
            if hashlib.sha256(body).hexdigest() == self.artifact.chunks[index]:
                self.have[index] = bytes(body)
            else:
                self.bad += 1

    def done(self) -> bool:
        return len(self.have) == len(self.artifact.chunks)

    def check(self) -> None:
        whole = hashlib.sha256()
        for i in range(len(self.artifact.chunks)):
            whole.update(self.have[i])
        if whole.hexdigest() != self.artifact.sha256:
            raise ArtifactError(f"artifact {self.artifact.sha256[:12]}: the chunks' sha256 differs")
