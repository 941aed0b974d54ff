"""fleet push: store a package as a content-addressed artifact, publish its signed retained desired state,
and optionally wait until every targeted device reports that version committed (or says why not)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypedDict

from agent.artifacts.manifest import ArtifactFields, Manifest, compare_versions, parse_envelope
from agent.artifacts.store import ContentStore, hash_file
from agent.errors import ManifestError, ModelError
from agent.fleet.outcome import ON_PROBATION, StatusDoc, device_outcome, same_version
from agent.fleet.pushspec import DEFAULT_CHUNK, PushSpec
from agent.fleet.registry import DeviceRegistry, registry_for_store, require_registry
from agent.fleet.watch import TERMINAL_BAD, FleetWatch


class DeviceResult(TypedDict):
    """One targeted device after `fleet push --wait`: committed, failed/rejected/rolled_back, pending or timeout."""

    result: str
    reason: str


def store_package(
    package: str | os.PathLike[str],
    store: str | os.PathLike[str],
    chunk_size: int = DEFAULT_CHUNK,
    validate: bool = True,
    delta: bool = True,
) -> ArtifactFields:
    """Put a package (bare .onnx, directory or .tar.gz) into the store; returns the manifest artifact fields
    (with `recipe`, the content-defined chunks a delta pull needs, unless delta is off or it is a gzip stream)."""
    package = Path(package)
    if not package.exists():
        raise ModelError(f"package {package} does not exist")
    if validate:
        from agent.package.unpack import check_loads

        check_loads(package)  # checker + shape inference (a generative package's own checks): refuse a broken one
    cs = ContentStore(store)
    recipe = None
    with tempfile.TemporaryDirectory(dir=cs.staging) as tmp:
        if package.is_dir():  # reproducible, and cut before compression so that versions share pieces
            from agent.artifacts.packtar import write_targz

            src, fmt = Path(tmp) / "package.tar.gz", "tar.gz"
            recipe = write_targz(package, src)
        elif package.name.endswith((".tar.gz", ".tgz")):
            src, fmt = package, "tar.gz"
        elif package.suffix == ".onnx":
            src, fmt = package, "onnx"
        else:
            raise ModelError(f"{package}: a package is a directory, a .tar.gz or a bare .onnx file")
        sha = cs.put_file(src)
    sha2, size, chunks = hash_file(cs.path(sha), chunk_size)
    art: ArtifactFields = {"sha256": sha2, "size": size, "chunk_size": chunk_size, "chunks": chunks, "format": fmt}
    if delta:
        from agent.artifacts.recipe import RecipeBook

        if recipe is not None:
            RecipeBook(cs).put(sha2, recipe)
        recipe = RecipeBook(cs).ensure(sha2)
        if recipe is not None:
            art["recipe"] = recipe
    return art


def _check_monotonic(watch: FleetWatch, topics: list[str], manifest: Manifest, timeout: float) -> None:
    """Refuse to publish a version that is not newer than what a target topic already holds (unless rollback)."""
    seen: dict[str, bytes] = {}
    for topic in topics:
        watch.link.subscribe(topic, lambda t, p, r: seen.__setitem__(t, p), qos=1)
    watch.sync(timeout)
    for topic, payload in seen.items():
        if not payload:
            continue
        try:
            old, _, _ = parse_envelope(payload)
            old_version = old["version"]
            cmp = compare_versions(manifest.version, old_version)
        except (ManifestError, KeyError, TypeError):
            continue  # an unreadable old desired state is simply replaced
        if cmp < 0 and not manifest.rollback:
            raise ManifestError(
                f"{topic} already holds version {old_version}; {manifest.version} is older "
                "(use --rollback to publish a signed rollback)"
            )
        if cmp == 0 and old.get("artifact", {}).get("sha256") != manifest.artifact.sha256:
            raise ManifestError(
                f"{topic} already holds version {old_version} with a different artifact; "
                "versions are immutable: bump --version"
            )


def push(
    package: str | os.PathLike[str], spec: PushSpec, progress: Callable[..., None] | None = None
) -> dict[str, Any]:
    """Store the package and publish it as `spec` says; returns the push document (`fleet push --json`). With
    `spec.wait`, `ok` says whether every targeted device committed."""
    from agent.artifacts.keys import key_id, load_private_key

    progress = progress or (lambda event, **f: None)
    registry = _registry(spec)
    key = load_private_key(spec.key_file)
    progress("store", package=str(package))
    art = store_package(package, spec.store, spec.chunk_size, validate=spec.validate, delta=spec.delta)
    sources = [{"type": "mqtt"}] + (
        [{"type": "http", "url": spec.http_url.replace("{sha256}", art["sha256"])}] if spec.http_url else []
    )
    devices, groups = list(spec.devices), list(spec.groups)
    manifest = Manifest.for_stored(
        art,
        name=spec.name,
        version=spec.version,
        sources=sources,
        devices=devices,
        groups=groups,
        qualification=spec.qualification,
        ttl_s=spec.ttl_s,
        rollback=spec.rollback,
    )
    envelope = manifest.sign(key)
    topics = spec.topics
    doc: dict[str, Any] = {
        "name": spec.name,
        "version": spec.version,
        "sha256": art["sha256"],
        "size": art["size"],
        "format": art["format"],
        "key_id": key_id(key.public_key()),
        "targets": {"devices": devices, "groups": groups},
        "topics": topics,
        "expires_at": manifest.expires_at,
        "rollback": spec.rollback,
        "waited": spec.wait is not None,
    }
    doc["registry"] = str(registry.path) if registry is not None else None
    with FleetWatch(spec.broker, spec.prefix, events=spec.wait is not None, registry=registry) as watch:
        _check_monotonic(watch, topics, manifest, 15.0)
        baseline = {dev: _dep_key(d, spec.name) for dev, d in watch.status.items()}
        infos = [watch.link.publish(t, envelope, qos=1, retain=True) for t in topics]
        for info in infos:
            info.wait_for_publish(15)
        progress("published", topics=topics, version=spec.version)
        if spec.wait is not None:
            doc["devices"] = wait_for_devices(watch, spec, baseline, progress)
            doc["ok"] = bool(doc["devices"]) and all(r["result"] == "committed" for r in doc["devices"].values())
        else:
            doc["ok"] = True
    return doc


def _registry(spec: PushSpec) -> DeviceRegistry | None:
    """The store's device registry; with `wait`, one that can verify every targeted device (fail fast: waiting
    needs reports that can be verified)."""
    if spec.wait is None:
        return registry_for_store(spec.store)
    registry = require_registry(spec.store, "fleet push --wait")
    registry.check_waitable("fleet push --wait", spec.devices, spec.groups, spec.store)
    return registry


def _dep_key(status: StatusDoc, name: str) -> tuple[Any, Any, Any, Any] | None:
    dep = (status.get("deployments") or {}).get(name)
    return (dep.get("id"), dep.get("version"), dep.get("state"), dep.get("ts")) if isinstance(dep, dict) else None


def device_result(status: StatusDoc, name: str, version: str, fresh: bool) -> tuple[str, str]:
    """(result, reason) of one device for one pushed version: committed, failed/rejected/rolled_back, pending."""
    return device_outcome(status, name, version, fresh=fresh)


def _prefix_hint(watch: FleetWatch) -> str:
    """When no device at all reports under this prefix: where devices do report (a prefix or broker mismatch)."""
    if watch.status:
        return ""
    from agent.fleet.clear import heard_prefixes

    others = [p for p in heard_prefixes(watch.link) if p != watch.topics.prefix]
    where = f"devices report under: {', '.join(others)}" if others else "no device reports on this broker at all"
    return (
        f"; no device has a status under prefix {watch.topics.prefix!r}: {where} (check --prefix and --broker; "
        f"`edge-agent fleet clear` removes a desired state left on a wrong prefix)"
    )


def wait_for_devices(
    watch: FleetWatch,
    spec: PushSpec,
    baseline: dict[str, tuple[Any, Any, Any, Any] | None],
    progress: Callable[..., None],
) -> dict[str, DeviceResult]:
    """Wait up to `spec.wait` seconds until each targeted device is committed or has failed; pending devices
    time out with their state."""
    results: dict[str, DeviceResult] = {d: {"result": "pending", "reason": "no status yet"} for d in spec.devices}
    if watch.registry is not None:  # group members come from the registry, never from a device's claim
        for g in spec.groups:
            for dev in watch.registry.members(g):
                results.setdefault(dev, {"result": "pending", "reason": "no status yet"})
    deadline = time.monotonic() + (spec.wait or 0.0)
    while True:
        _take_failures(watch, spec, results, progress)
        _take_statuses(watch, spec, results, baseline, progress)
        pending = [d for d, r in results.items() if r["result"] == "pending"]
        if results and not pending:
            return results
        if time.monotonic() >= deadline:
            return _timed_out(watch, spec, results, pending)


def _take_failures(
    watch: FleetWatch, spec: PushSpec, results: dict[str, DeviceResult], progress: Callable[..., None]
) -> None:
    """The failures targeted devices announced as events (FleetWatch hands on verified events only)."""
    for kind, dev, doc in watch.drain(timeout=0.5):
        if (
            kind == "events"
            and dev in results
            and doc.get("model") == spec.name
            and same_version(doc.get("version"), spec.version)
            and doc.get("state") in TERMINAL_BAD
        ):
            results[dev] = {"result": doc["state"], "reason": str(doc.get("reason") or doc["state"])}
            progress("device", device_id=dev, **results[dev])


def _take_statuses(
    watch: FleetWatch,
    spec: PushSpec,
    results: dict[str, DeviceResult],
    baseline: dict[str, tuple[Any, Any, Any, Any] | None],
    progress: Callable[..., None],
) -> None:
    """Each still pending device's retained status, read for this version; every change is said as it happens."""
    for dev, status in watch.status.items():
        if dev not in results or results[dev]["result"] != "pending":
            continue
        fresh = _dep_key(status, spec.name) != baseline.get(dev)
        result, reason = device_result(status, spec.name, spec.version, fresh)
        if results[dev]["reason"] != reason:
            on_probation = result == "pending" and reason.startswith(ON_PROBATION)  # not committed yet
            progress("device", device_id=dev, result=ON_PROBATION if on_probation else result, reason=reason)
        results[dev] = {"result": result, "reason": reason}


def _timed_out(
    watch: FleetWatch, spec: PushSpec, results: dict[str, DeviceResult], pending: list[str]
) -> dict[str, DeviceResult]:
    """The results at the deadline: each pending device timed out in its last state (with a hint when no device
    reports under this prefix at all); a group none of whose devices reported, by the group's name."""
    hint = _prefix_hint(watch)
    for d in pending:
        why = f"timed out after {spec.wait or 0.0:g} s ({results[d]['reason']})"
        results[d] = {"result": "timeout", "reason": why + hint}
    if not results:
        results = {
            f"group:{g}": {"result": "timeout", "reason": f"no device of group {g} reported a status"}
            for g in spec.groups
        }
    return results
