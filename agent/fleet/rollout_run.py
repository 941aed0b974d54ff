"""Composition of a rollout or a manual rollback: key, artifact in the store, fleet link, engine, summary."""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from agent.artifacts.manifest import ArtifactFields
from agent.errors import ConfigError
from agent.fleet import rollout_state as rs
from agent.fleet.outcome import StatusDoc
from agent.fleet.registry import DeviceRegistry, registry_for_store, require_registry
from agent.fleet.rollout import RolloutEngine, open_rollout
from agent.fleet.rollout_link import FleetLink, ManifestDoc, ManifestIssuer, base_manifest
from agent.fleet.rollout_plan import Planned, RolloutSpec, check_name, check_version
from agent.transport.mqtt import BrokerConfig

MANIFEST_TTL_S = 30 * 86400
DEFAULT_CHUNK = 256 * 1024


def stored_artifact(
    store: str | Path, sha256: str, fmt: str | None = None, chunk_size: int = DEFAULT_CHUNK
) -> ArtifactFields | None:
    """Manifest artifact fields for a blob already in the control plane's store (None if it is not there)."""
    from agent.artifacts.store import ContentStore, hash_file

    cs = ContentStore(store)
    if not cs.has(sha256):
        return None
    sha, size, chunks = hash_file(cs.path(sha256), chunk_size)
    if fmt is None:
        with open(cs.path(sha256), "rb") as f:
            fmt = "tar.gz" if f.read(2) == b"\x1f\x8b" else "onnx"
    from agent.artifacts.recipe import RecipeBook

    art: ArtifactFields = {"sha256": sha, "size": size, "chunk_size": chunk_size, "chunks": chunks, "format": fmt}
    recipe = RecipeBook(cs).ensure(sha)  # a delta-capable manifest for the rollback version too
    if recipe is not None:
        art["recipe"] = recipe
    return art


def _sources(artifact: Mapping[str, Any], http_url: str | None, http_only: bool = False) -> list[dict[str, str]]:
    """MQTT chunks (and an http(s) URL, e.g. a CDN); http_only keeps the artifact bytes off the broker."""
    if http_only and not http_url:
        raise ConfigError("--http-only needs --http-url URL (where devices download the artifact)")
    src: list[dict[str, str]] = [] if http_only else [{"type": "mqtt"}]
    if http_url:
        if not http_url.startswith(("http://", "https://")):
            raise ConfigError(f"--http-url: expected an http:// or https:// URL, got {http_url!r}")
        src.append({"type": "http", "url": http_url.replace("{sha256}", artifact["sha256"])})
    return src


def _manifest_extras(
    spec: RolloutSpec,
    store: str | Path,
    artifact: ArtifactFields,
    sources: list[dict[str, str]],
    now: float,
    progress: Callable[..., None],
    link: FleetLink | None = None,
) -> Callable[[Planned], dict[str, Any]]:
    """Persist every manifest the rollout may sign (the new version, each previous version to roll back to)
    and each device's desired state before the rollout (restored as it was on devices that never change)."""

    def extras(planned: Planned) -> dict[str, Any]:
        if link is not None:
            for dev, before in link.device_desired(spec.name, planned["devices"]).items():
                planned["devices"][dev]["previous_desired"] = before
        manifests = {spec.version: base_manifest(spec.name, spec.version, artifact, sources, MANIFEST_TTL_S, now)}
        warnings: list[str] = []
        for dev, d in sorted(planned["devices"].items()):
            prev, sha = d["previous_version"], d.get("previous_sha256")
            if prev is None or prev in manifests:
                continue
            found = stored_artifact(store, sha, chunk_size=artifact["chunk_size"]) if sha else None
            if found is None:
                warnings.append(
                    f"{dev}: version {prev} ({(sha or 'sha256 unknown')[:16]}) is not in {store}; "
                    "that device cannot be rolled back automatically"
                )
                continue
            manifests[prev] = base_manifest(spec.name, prev, found, [{"type": "mqtt"}], MANIFEST_TTL_S, now)
        for w in warnings:
            progress("warning", message=w)
        return {"manifests": manifests, "warnings": warnings}

    return extras


def run_rollout(
    package: str | os.PathLike[str],
    spec: RolloutSpec,
    *,
    key_file: str | os.PathLike[str],
    store: str | Path,
    broker: BrokerConfig | str,
    prefix: str = "edge",
    http_url: str | None = None,
    http_only: bool = False,
    wait: bool = True,
    progress: Callable[..., None] | None = None,
    stop: threading.Event | None = None,
    tick_s: float = 1.0,
    chunk_size: int = DEFAULT_CHUNK,
) -> dict[str, Any]:
    """Start or resume the rollout of `package` described by `spec`; returns the summary document."""
    from agent.artifacts.keys import load_private_key

    progress = progress or (lambda event, **f: None)
    registry = require_registry(store, "fleet rollout")  # fail fast: every decision rests on verified reports
    key = load_private_key(key_file)
    _sources({"sha256": ""}, http_url, http_only)  # bad flags fail before anything is stored
    Path(store).mkdir(parents=True, exist_ok=True)
    from agent.fleet.push import store_package

    artifact = store_package(package, store, chunk_size)
    sources = _sources(artifact, http_url, http_only)
    with FleetLink(broker, prefix, registry=registry) as link:
        extras = _manifest_extras(spec, store, artifact, sources, time.time(), progress, link)
        state, resumed = open_rollout(
            store,
            spec,
            registered_population(registry, link.statuses(), progress),
            {"sha256": artifact["sha256"], "size": artifact["size"], "format": artifact.get("format")},
            extras=extras,
        )
        if resumed:
            progress("resumed", rollout_id=state["rollout_id"], path=str(rs.state_path(store, state["rollout_id"])))
        engine = RolloutEngine(store, state, link, ManifestIssuer(key, state["manifests"]), progress)
        summary = engine.run(wait=wait, stop=stop, tick_s=tick_s)
        summary["warnings"] = state.get("warnings", [])
    return summary


def registered_population(
    registry: DeviceRegistry, statuses: dict[str, StatusDoc], progress: Callable[..., None] | None = None
) -> dict[str, StatusDoc]:
    """What a rollout plans on: every registered device (its groups from the registry), with its status as the
    registry lets the control plane believe it; a registered device that never reported is an offline member
    (it counts as silent at the deadline). A status of a device outside the registry is left out."""
    out = {
        dev: statuses.get(dev)
        or {"device_id": dev, "online": False, "groups": registry.groups(dev), "trust": "no report"}
        for dev in sorted(registry.devices)
    }
    strangers = sorted(d for d in statuses if d not in registry.devices)
    if strangers and progress is not None:
        progress(
            "warning",
            message=f"{len(strangers)} device(s) report a status but are not in the device registry: left out "
            f"(first: {strangers[0]})",
        )
    return out


def _previous_from_rollouts(store: str | Path, name: str, device: str) -> tuple[str | None, ManifestDoc | None]:
    """The version `device` ran before the latest rollout of `name` that touched it, and its manifest base."""
    for state in sorted(rs.list_states(store), key=lambda s: s["created"], reverse=True):
        d = state["devices"].get(device)
        if state["spec"]["name"] == name and d and d["result"] != rs.PENDING and d["previous_version"]:
            prev = d["previous_version"]
            return prev, state.get("manifests", {}).get(prev)
    return None, None


def _manifest_for(store: str | Path, name: str, version: str) -> ManifestDoc | None:
    for state in rs.list_states(store):
        if state["spec"]["name"] == name and version in state.get("manifests", {}):
            found: ManifestDoc = state["manifests"][version]
            return found
    return None


def run_rollback(
    name: str,
    *,
    device: str | None,
    group: str | None,
    version: str | None,
    key_file: str | os.PathLike[str],
    store: str | Path,
    broker: BrokerConfig | str,
    prefix: str = "edge",
    wait_s: float = 0.0,
) -> dict[str, Any]:
    """Publish signed rollback manifests for `name` on one device or a group; optionally wait for confirmation."""
    from agent.artifacts.keys import load_private_key

    check_name(name, "NAME")
    if version is not None:
        check_version(version)
    if device:
        check_name(device, "--device")
    else:
        check_name(group, "--group")
    # membership comes only from the registry, and a confirmation only from a verified report
    needs = "fleet rollback --wait" if wait_s > 0 else "fleet rollback --group" if not device else None
    registry = require_registry(store, needs) if needs else registry_for_store(store)
    if device and wait_s > 0:
        assert registry is not None  # require_registry above
        registry.check_waitable("fleet rollback --wait", [device], [], store)
    key = load_private_key(key_file)
    rows: list[dict[str, Any]] = []
    manifests: dict[str, ManifestDoc] = {}
    with FleetLink(broker, prefix, registry=registry) as link:
        if device:
            targets = [device]
        else:
            assert registry is not None and group is not None  # require_registry and check_name above
            targets = registry.members(group)
            if not targets:
                raise ConfigError(f"no device of group {group!r} is in the device registry {registry.path}")
        for dev in targets:
            ver, base = (
                (version, _manifest_for(store, name, version)) if version else _previous_from_rollouts(store, name, dev)
            )
            row: dict[str, Any] = {"device_id": dev, "version": ver}
            if ver is None:
                row.update(
                    result="skipped",
                    reason=f"no version to return to: no rollout recorded in {store} "
                    f"saw an earlier {name} on this device (pass --version)",
                )
            elif base is None:
                row.update(
                    result="skipped",
                    reason=f"no manifest for {name} {ver} in {store}: it was never rolled out from here",
                )
            else:
                now = int(time.time())  # a rollback is a new decision: fresh issue time and expiry
                manifests[ver] = {**base, "issued_at": now, "expires_at": now + MANIFEST_TTL_S}
                link.publish_desired(dev, name, ManifestIssuer(key, manifests).envelope(dev, ver, rollback=True))
                row.update(result="published", reason=f"signed rollback to {ver} published")
            rows.append(row)
        _wait_rollback(link, name, rows, wait_s)
    return {"model": name, "devices": rows}


def _wait_rollback(link: FleetLink, name: str, rows: list[dict[str, Any]], wait_s: float) -> None:
    deadline = time.monotonic() + wait_s
    pending = [r for r in rows if r["result"] == "published"]
    while pending and wait_s > 0:
        statuses = link.statuses()
        for r in list(pending):
            result, reason = rs.observe(statuses.get(r["device_id"]), name, r["version"])
            if result is not None:
                r.update(result="rolled_back" if result in rs.TOOK else "failed", reason=reason)
                pending.remove(r)
        if not pending or time.monotonic() > deadline:
            break
        link.wait_change(min(1.0, max(0.05, deadline - time.monotonic())))
    for r in pending:
        if wait_s > 0:
            r.update(result="failed", reason=f"no confirmation within {wait_s:g} s")
