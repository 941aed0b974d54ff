"""MqttSource: the MQTT DeploymentSource (verified desired state in, artifact pull) and the device's reporting out.

Every retained desired-state message is verified completely (lifecycle.desired) before the orchestrator sees
it: a forged, unsigned, untrusted, expired, untargeted or future-dated envelope is reported as rejected and
changes nothing that runs. Downloads retry transient failures (broker or artifact server gone, stalls) with
backoff and jitter until the manifest expires or the state's deadline passes.
"""

from __future__ import annotations

import collections
import queue
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError, LifecycleError
from agent.fleet.agent_release import RELEASE_NAME
from agent.lifecycle.context import Rejected, StepContext
from agent.lifecycle.desired import RECHECK_S, Candidate, DesiredBook, version_order
from agent.lifecycle.journal import Deployment
from agent.lifecycle.ports import Deployments, SourceEvents
from agent.lifecycle.record import Fetched
from agent.lifecycle.retry import retry_transient

MAX_REJECTED = 64  # models whose last rejection the status document keeps
REPORTED_MEMORY = 4096  # (model, scope, digest) rejections already reported (each is reported once)


class MqttSource:
    """kind "manifest": owns the DeviceLink, the verified DesiredBook and the pull of manifest artifacts."""

    kind = "manifest"

    def __init__(
        self,
        config: Any,
        state_dir: Path,
        store: Any,
        slots: Any,
        *,
        deployments: Deployments,
        events: SourceEvents,
        stall_s: float = 30.0,
    ) -> None:
        from agent.artifacts.keys import device_key, trusted_keys
        from agent.transport.device import DeviceLink

        m = config.mqtt
        tls = m.tls
        self.config, self.store, self.slots = config, store, slots
        self.deployments = deployments
        self.events = events  # told of each connection change and each refused desired state (its event: ours)
        self.stall_s = stall_s
        self.keys = trusted_keys(list(config.trust.public_keys))
        self.book = DesiredBook(lambda: self.keys, config.device_id, config.groups, max_skew_s=config.trust.max_skew_s)
        self.rejected: collections.OrderedDict[str, dict[str, Any]] = collections.OrderedDict()
        self._reported: collections.OrderedDict[tuple[str, str, str], None] = collections.OrderedDict()
        self._up = False
        self._last_recheck = time.monotonic()
        # models whose in-flight deployment was called off: resolved again once it has ended, because a cancel that
        # comes as the deployment commits is too late, and the desired state must then undo what it committed
        self._called_off: set[str] = set()
        self.releases: Any = None  # agent.services.release_update.ReleaseUpdater: takes `edge-agent` (kind: agent)
        self.ca = _s(tls.ca) if tls else None
        self.link = DeviceLink(
            m.url,
            config.device_id,
            groups=config.groups,
            prefix=m.topic_prefix,
            username=m.username,
            password=m.password(),
            ca=self.ca,
            cert=_s(tls.cert) if tls else None,
            key=_s(tls.key) if tls else None,
            last_status=_last_status(state_dir),
            signer=device_key(state_dir),  # made on first start when `edge-agent keys device` was not run
        )

    def reload_keys(self, paths: Any) -> None:
        from agent.artifacts.keys import trusted_keys

        self.keys = trusted_keys(list(paths))

    def start(self) -> "MqttSource":
        self.link.start()
        return self

    def stop(self, graceful: bool = True) -> None:
        self.link.stop(graceful=graceful)

    def ready(self) -> bool:
        """Up once the link has connected (in-flight downloads resume only then; later outages are retried)."""
        return self._up

    # ---- loop side: verify, resolve, submit ----------------------------------------------------
    def poll(self) -> None:
        """Drain the link's events (a burst comes coalesced per scope and model), verify, submit the winners."""
        changed: list[str] = []
        refused: list[tuple[str, Candidate]] = []
        while True:
            try:
                ev = self.link.events.get(timeout=0)
            except queue.Empty:
                break
            if ev.kind == "connection":
                self._up = self._up or ev.connected
                self.events.connection(ev.connected, ev.reason)
                continue
            refused += [(ev.model, c) for c in self.book.update(ev.scope, ev.model, ev.payload, ev.topic)]
            if ev.model not in changed:
                changed.append(ev.model)
        if time.monotonic() - self._last_recheck >= RECHECK_S:
            self._last_recheck = time.monotonic()
            again, still = self.book.recheck()
            changed += [m for m in again if m not in changed]
            refused += still
        if self._called_off:
            flying = self.deployments.in_flight()
            for model in [m for m in self._called_off if m not in flying]:
                self._called_off.discard(model)
                if model not in changed:
                    changed.append(model)
        for model, cand in refused:
            self._reject(model, cand, cand.rejection)
        for model in changed:
            self._resolve(model)

    def _resolve(self, model: str) -> None:
        winner = self.book.resolve(model)
        if winner is not None and winner.manifest is not None and model == RELEASE_NAME:
            self._release(winner)  # an agent release, not a model: never the lifecycle's
            return
        if winner is None or winner.manifest is None or self.deployments.seen(model, winner.digest):
            return
        m = winner.manifest
        committed = self.slots.committed(model)
        have = committed.version if committed is not None else None
        if committed is not None and have == m.version and committed.sha256 == m.artifact.sha256:
            # what serves already (its journal record was compacted away): the lifecycle decides about a deployment
            # of another version in flight; once one called off has ended, the model is resolved again
            if self.deployments.settle(model, m.version):
                self._called_off.add(model)
            return
        bad = version_order(m, have)
        if bad is not None:
            self._reject(model, winner, bad)
            return
        self.deployments.submit(
            model,
            m.version,
            {
                "kind": "manifest",
                "envelope": winner.envelope.decode("utf-8"),
                "digest": winner.digest,
                "from": winner.scope,
            },
            manifest=m.to_dict(),
            key_id=m.key_id,
        )

    def _release(self, winner: Candidate) -> None:
        from agent.artifacts.manifest import ManifestRejected

        if self.releases is None:
            why = "this agent does not run from a release root (install.sh --release): it cannot update itself"
            self._reject(RELEASE_NAME, winner, ManifestRejected("not-applicable", why))
            return
        self.releases.offer(winner.manifest, winner.digest)

    def fetch_release(self, m: Any) -> Path:
        """An agent release's archive pulled like a model's artifact (resumable, delta-capable), three tries."""
        from agent.artifacts.deadline import DownloadLimits
        from agent.artifacts.delta import fetch_delta

        dl = self.config.downloads
        limits = DownloadLimits(min_bytes=dl.min_bytes, interval_s=dl.interval_s, overall_s=dl.timeout_s)
        for attempt in range(3):
            try:
                path, _ = fetch_delta(
                    m, self.store, link=self.link, ca=self.ca, stall_timeout=self.stall_s, limits=limits,
                    check=lambda: None, allow_http=dl.allow_http,
                )  # fmt: skip
                return path
            except EdgeAgentError:
                if attempt == 2:
                    raise
                time.sleep(2.0 * (attempt + 1))
        raise AssertionError("unreachable")

    def _reject(self, model: str, cand: Candidate, exc: Any) -> None:
        key = (model, cand.scope, cand.digest + (exc.code if exc else ""))
        if key in self._reported:
            return
        self._reported[key] = None
        while len(self._reported) > REPORTED_MEMORY:
            self._reported.popitem(last=False)
        from agent.artifacts.manifest import rejection_record

        record = {**rejection_record(exc), "model": model, "from": cand.scope, "reason": f"{exc.code}: {exc.reason}"}
        self.rejected[model] = record
        self.rejected.move_to_end(model)
        while len(self.rejected) > MAX_REJECTED:
            self.rejected.popitem(last=False)
        self.events.rejected(record)
        self.publish_event(
            {
                "deployment_id": None,
                "model": model,
                "version": record.get("version"),
                "state": "rejected",
                "reason": record.get("reason"),
                "code": record.get("code"),
                "ts": record.get("ts"),
            }
        )

    # ---- DeploymentSource: RECEIVED and DOWNLOADING --------------------------------------------
    def check(self, dep: Deployment) -> None:
        """RECEIVED (also after a restart): verify the envelope again now (time passed, keys may have changed)."""
        from agent.artifacts.manifest import ManifestRejected, receive

        committed = self.slots.committed(dep.model)
        try:
            m = receive(
                dep.source["envelope"].encode(),
                self.keys,
                committed.version if committed is not None else None,
                device_id=self.config.device_id,
                groups=self.config.groups,
                free_bytes=self.store.free_bytes(),
                max_skew_s=self.book.max_skew_s,
            )
        except ManifestRejected as exc:
            raise Rejected(f"{exc.code}: {exc.reason}") from None
        except EdgeAgentError as exc:
            raise Rejected(f"malformed: {exc}") from None
        if m.name != dep.model or m.version != dep.version:
            raise Rejected(f"malformed: manifest {m.name} {m.version} was filed as {dep.model} {dep.version}")
        dep.data["manifest"] = m.to_dict()
        dep.data["key_id"] = m.key_id

    def fetch(self, dep: Deployment, ctx: StepContext) -> Fetched:
        """DOWNLOADING: resumable pull (the manifest's sources in order) into the store; transient failures are
        retried with backoff and jitter until the manifest expires (or the state's deadline)."""
        from agent.artifacts.deadline import DownloadLimits
        from agent.artifacts.delta import fetch_delta
        from agent.artifacts.fetch import is_transient
        from agent.artifacts.manifest import Manifest

        m = Manifest.from_dict(dep.data["manifest"], dep.data.get("key_id"))

        def progress(event: str, **fields: Any) -> None:
            ctx.check()
            ctx.report(event, **fields)

        dl = self.config.downloads
        limits = DownloadLimits(min_bytes=dl.min_bytes, interval_s=dl.interval_s, overall_s=dl.timeout_s)
        moved: dict[str, int] = {}

        def attempt() -> None:  # ctx.check: a cancel or the state's deadline ends the pull within 0.5 s
            _, got = fetch_delta(
                m,
                self.store,
                link=self.link,
                progress=progress,
                ca=self.ca,
                stall_timeout=self.stall_s,
                limits=limits,
                check=ctx.check,
                allow_http=dl.allow_http,
            )
            moved.update(got)

        retry_transient(attempt, ctx, transient=is_transient, until=float(m.expires_at), what="download")
        if not self.store.has(m.artifact.sha256):
            raise LifecycleError("the pull finished but the artifact is not in the store")
        return Fetched(sha256=m.artifact.sha256, size=m.artifact.size, transfer=moved)

    def landed(self, dep: Deployment) -> None:
        """Nothing to let go of: the pulled chunks are the blob."""

    # ---- reporting -----------------------------------------------------------------------------
    def publish_status(self, doc: dict[str, Any]) -> None:
        self._quiet(self.link.publish_status, doc)

    def publish_event(self, doc: dict[str, Any]) -> None:
        self._quiet(self.link.publish_event, doc)

    def publish_health(self, doc: dict[str, Any]) -> None:
        self._quiet(self.link.publish_health, doc)

    def publish_attestation(self, model: str, kind: str, envelope: bytes) -> None:
        try:
            self.link.publish_attestation(model, kind, envelope)
        except EdgeAgentError:
            pass  # offline: the file stays in state_dir/attestations

    def _quiet(self, fn: Callable[[dict[str, Any]], None], doc: dict[str, Any]) -> None:
        try:
            fn(doc)
        except EdgeAgentError:
            pass  # offline: the retained status is republished on reconnect


def _s(p: object) -> str | None:
    return str(p) if p is not None else None


def _last_status(state_dir: Path) -> dict[str, Any] | None:
    """The last status document written (status.json), for the LWT snapshot; None when unreadable."""
    from agent.lifecycle.status_doc import status_path
    from agent.util.atomic import read_json

    try:
        doc = read_json(status_path(state_dir))
    except (OSError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None
