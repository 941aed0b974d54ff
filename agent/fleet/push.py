"""fleet push: store a package as a content-addressed artifact, publish its signed retained desired state,
and optionally wait until every targeted device reports that version committed (or says why not)."""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any, TypedDict

from agent.artifacts.manifest import ArtifactFields, Manifest, compare_versions, parse_envelope, parse_version
from agent.artifacts.store import ContentStore, hash_file
from agent.errors import ConfigError, ManifestError, ModelError
from agent.fleet.outcome import ON_PROBATION, StatusDoc, device_outcome, same_version
from agent.fleet.registry import DeviceRegistry, registry_for_store, require_registry
from agent.fleet.watch import TERMINAL_BAD, FleetWatch
from agent.transport.mqtt import BrokerConfig
from agent.transport.topics import DEFAULT_PREFIX, check_name

DEFAULT_CHUNK = 256 * 1024
DEFAULT_TTL_S = 30 * 86400


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
        from agent.package.load import load_package

        load_package(package)  # checker + shape inference: refuse to ship a broken model
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


def _targets(prefix: str, name: str, devices: Iterable[str], groups: Iterable[str]) -> list[str]:
    from agent.transport.topics import Topics

    t = Topics(prefix)
    return [t.device_desired(d, name) for d in devices] + [t.group_desired(g, name) for g in groups]


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
    package: str | os.PathLike[str],
    *,
    name: str,
    version: str,
    key_file: str | os.PathLike[str],
    store: str | os.PathLike[str],
    broker: BrokerConfig,
    prefix: str = DEFAULT_PREFIX,
    devices: Iterable[str] = (),
    groups: Iterable[str] = (),
    http_url: str | None = None,
    chunk_size: int = DEFAULT_CHUNK,
    ttl_s: int = DEFAULT_TTL_S,
    rollback: bool = False,
    qualification: dict[str, Any] | None = None,
    wait: float | None = None,
    validate: bool = True,
    progress: Callable[..., None] | None = None,
    delta: bool = True,
) -> dict[str, Any]:
    """Returns the push document (`fleet push --json`); with `wait`, `ok` says whether every device committed.
    delta: the manifest carries the chunk recipe devices use to fetch only what changed (agent.artifacts.delta)."""
    from agent.artifacts.keys import key_id, load_private_key

    progress = progress or (lambda event, **f: None)
    check_name(name, "model name", ConfigError)
    parse_version(version)
    devices, groups = list(devices), list(groups)
    if bool(devices) == bool(groups):
        raise ConfigError("give the targets with --device ID or with --group G (one of the two)")
    for d in devices:
        check_name(d, "device id", ConfigError)
    for g in groups:
        check_name(g, "group", ConfigError)
    registry: DeviceRegistry | None
    if wait is not None:  # fail fast: waiting needs reports that can be verified
        registry = require_registry(store, "fleet push --wait")
        registry.check_waitable("fleet push --wait", devices, groups, store)
    else:
        registry = registry_for_store(store)
    key = load_private_key(key_file)
    progress("store", package=str(package))
    art = store_package(package, store, chunk_size, validate=validate, delta=delta)
    sources = [{"type": "mqtt"}] + (
        [{"type": "http", "url": http_url.replace("{sha256}", art["sha256"])}] if http_url else []
    )
    manifest = Manifest.for_stored(
        art,
        name=name,
        version=version,
        sources=sources,
        devices=devices,
        groups=groups,
        qualification=qualification,
        ttl_s=ttl_s,
        rollback=rollback,
    )
    envelope = manifest.sign(key)
    topics = _targets(prefix, name, devices, groups)
    doc: dict[str, Any] = {
        "name": name,
        "version": version,
        "sha256": art["sha256"],
        "size": art["size"],
        "format": art["format"],
        "key_id": key_id(key.public_key()),
        "targets": {"devices": devices, "groups": groups},
        "topics": topics,
        "expires_at": manifest.expires_at,
        "rollback": rollback,
        "waited": wait is not None,
    }
    doc["registry"] = str(registry.path) if registry is not None else None
    with FleetWatch(broker, prefix, events=wait is not None, registry=registry) as watch:
        _check_monotonic(watch, topics, manifest, 15.0)
        baseline = {dev: _dep_key(d, name) for dev, d in watch.status.items()}
        infos = [watch.link.publish(t, envelope, qos=1, retain=True) for t in topics]
        for info in infos:
            info.wait_for_publish(15)
        progress("published", topics=topics, version=version)
        if wait is not None:
            doc["devices"] = wait_for_devices(watch, name, version, devices, groups, wait, baseline, progress)
            doc["ok"] = bool(doc["devices"]) and all(r["result"] == "committed" for r in doc["devices"].values())
        else:
            doc["ok"] = True
    return doc


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
    name: str,
    version: str,
    devices: Iterable[str],
    groups: Iterable[str],
    timeout: float,
    baseline: dict[str, tuple[Any, Any, Any, Any] | None],
    progress: Callable[..., None],
) -> dict[str, DeviceResult]:
    """Wait until each targeted device is committed or has failed; pending devices time out with their state."""
    results: dict[str, DeviceResult] = {d: {"result": "pending", "reason": "no status yet"} for d in devices}
    if watch.registry is not None:  # group members come from the registry, never from a device's claim
        for g in groups:
            for dev in watch.registry.members(g):
                results.setdefault(dev, {"result": "pending", "reason": "no status yet"})
    deadline = time.monotonic() + timeout
    while True:
        for kind, dev, doc in watch.drain(timeout=0.5):
            if (  # FleetWatch hands on verified events only
                kind == "events"
                and dev in results
                and doc.get("model") == name
                and same_version(doc.get("version"), version)
                and doc.get("state") in TERMINAL_BAD
            ):
                results[dev] = {"result": doc["state"], "reason": str(doc.get("reason") or doc["state"])}
                progress("device", device_id=dev, **results[dev])
        for dev, status in watch.status.items():
            if dev not in results or results[dev]["result"] != "pending":
                continue
            result, reason = device_result(status, name, version, _dep_key(status, name) != baseline.get(dev))
            if results[dev]["reason"] != reason:  # every change of a device's state is said as it happens
                on_probation = result == "pending" and reason.startswith(ON_PROBATION)  # not committed yet
                progress("device", device_id=dev, result=ON_PROBATION if on_probation else result, reason=reason)
            results[dev] = {"result": result, "reason": reason}
        pending = [d for d, r in results.items() if r["result"] == "pending"]
        if results and not pending:
            return results
        if time.monotonic() >= deadline:
            hint = _prefix_hint(watch)
            for d in pending:
                why = f"timed out after {timeout:g} s ({results[d]['reason']})"
                results[d] = {"result": "timeout", "reason": why + hint}
            if not results:
                results = {
                    f"group:{g}": {"result": "timeout", "reason": f"no device of group {g} reported a status"}
                    for g in groups
                }
            return results
