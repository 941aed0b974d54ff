"""MQTT mode of the daemon: desired state in (signed manifests), artifact pull, events and retained status out."""

from __future__ import annotations

import hashlib
import json
import queue
from typing import Any

from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle import actions as act
from agent.lifecycle.journal import NAME_RE, Deployment


class MqttMode:
    """Glue between a DeviceAgent's orchestrator and a transport.device.DeviceLink."""

    def __init__(self, agent):
        from agent.artifacts.keys import trusted_keys
        from agent.transport.device import DeviceLink

        cfg, m = agent.config, agent.config.mqtt
        tls = m.tls
        self.agent = agent
        self.keys = trusted_keys(list(cfg.trust.public_keys))
        self.link = DeviceLink(
            m.url,
            cfg.device_id,
            groups=cfg.groups,
            prefix=m.topic_prefix,
            username=m.username,
            password=m.password(),
            ca=_s(tls.ca) if tls else None,
            cert=_s(tls.cert) if tls else None,
            key=_s(tls.key) if tls else None,
            last_status=_last_status(agent.state_dir),
        )
        agent.steps.check_manifest = self.check_manifest
        agent.steps.fetch_manifest = self.fetch_manifest

    def reload_keys(self, paths) -> None:
        from agent.artifacts.keys import trusted_keys

        self.keys = trusted_keys(list(paths))

    def start(self) -> "MqttMode":
        self.link.start()
        return self

    def stop(self, graceful: bool = True) -> None:
        self.link.stop(graceful=graceful)

    # ---- loop side -----------------------------------------------------------------------------
    def poll(self) -> None:
        """Turn queued desired-state changes into deployments (called from the agent loop)."""
        while True:
            try:
                ev = self.link.events.get(timeout=0)
            except queue.Empty:
                return
            if getattr(ev, "kind", None) == "connection":
                self.agent._emit({"event": "mqtt", "connected": ev.connected, "reason": ev.reason})
                if ev.connected:
                    self.agent.write_status()
                continue
            if ev.envelope is None:
                continue  # desired state withdrawn: keep serving what is committed
            self._desired(ev.model, ev.envelope, ev.source)

    def _desired(self, model: str, envelope: bytes, source: str) -> None:
        version = _unverified_version(envelope)
        digest = hashlib.sha256(envelope).hexdigest()
        self.agent.orchestrator.submit(
            model,
            version,
            {"kind": "manifest", "envelope": envelope.decode("utf-8", "replace"), "digest": digest, "from": source},
        )

    # ---- lifecycle actions ---------------------------------------------------------------------
    def check_manifest(self, dep: Deployment) -> None:
        """RECEIVED: signature, trust, expiry, targeting, downgrade, size; raises act.Rejected."""
        from agent.artifacts.manifest import ManifestRejected, receive

        committed = self.agent.steps.slots.committed(dep.model) or {}
        try:
            m = receive(
                dep.source["envelope"].encode(),
                self.keys,
                committed.get("version"),
                device_id=self.agent.config.device_id,
                groups=self.agent.config.groups,
                free_bytes=self.agent.store.free_bytes(),
            )
        except ManifestRejected as exc:
            raise act.Rejected(f"{exc.code}: {exc.reason}") from None
        except EdgeAgentError as exc:
            raise act.Rejected(f"malformed: {exc}") from None
        if m.name != dep.model:
            raise act.Rejected(f"malformed: manifest names model {m.name!r} but was published for {dep.model!r}")
        if m.version != dep.version:
            raise act.Rejected(f"malformed: version {m.version!r} differs from the envelope's {dep.version!r}")
        dep.data["manifest"] = m.to_dict()
        dep.data["key_id"] = m.key_id

    def fetch_manifest(self, dep: Deployment, ctx: act.StepContext) -> dict[str, Any]:
        """DOWNLOADING: resumable pull (MQTT chunks, then http) into the store; progress doubles as the cancel check."""
        from agent.artifacts.fetch import fetch_artifact
        from agent.artifacts.manifest import Manifest

        m = Manifest.from_dict(dep.data["manifest"], dep.data.get("key_id"))

        def progress(event: str, **fields: Any) -> None:
            ctx.check()
            ctx.report(event, **fields)

        tls = self.agent.config.mqtt.tls
        fetch_artifact(m, self.agent.store, link=self.link, progress=progress, ca=_s(tls.ca) if tls else None)
        if not self.agent.store.has(m.artifact.sha256):
            raise LifecycleError("the pull finished but the artifact is not in the store")
        return {"sha256": m.artifact.sha256, "size": m.artifact.size}

    # ---- reporting -----------------------------------------------------------------------------
    def publish_status(self, doc: dict[str, Any]) -> None:
        self._quiet(self.link.publish_status, doc)

    def publish_event(self, doc: dict[str, Any]) -> None:
        self._quiet(self.link.publish_event, doc)

    def publish_health(self, doc: dict[str, Any]) -> None:
        self._quiet(self.link.publish_health, doc)

    def _quiet(self, fn, doc) -> None:
        try:
            fn(doc)
        except EdgeAgentError:
            pass  # offline: the retained status is republished on reconnect


def _unverified_version(envelope: bytes) -> str:
    """The version to file the deployment under before verification; 'unknown' when unreadable."""
    try:
        v = json.loads(envelope)["manifest"]["version"]
    except Exception:  # noqa: BLE001 - verification rejects it properly
        return "unknown"
    return v if isinstance(v, str) and NAME_RE.match(v) else "unknown"


def _s(p) -> str | None:
    return str(p) if p is not None else None


def _last_status(state_dir) -> dict | None:
    """The last status document written (status.json), for the LWT snapshot; None when unreadable."""
    from agent.lifecycle.status import status_path
    from agent.util.atomic import read_json

    try:
        doc = read_json(status_path(state_dir))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
