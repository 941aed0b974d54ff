"""Model versions into the service: one path for the API's upload (PUT /api/v1/models/NAME/versions/VERSION,
the bytes as the body) and the dashboard's (a file posted from the browser): the file is put in the content
store (agent.fleet.push.store_package) and the version recorded and audited. The dashboard's upload is first
checked with the rules of `edge-agent package --check` (agent.package.check), on the file as uploaded."""

from __future__ import annotations

import re
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sqlalchemy import select

from agent.controlplane import repo
from agent.controlplane.db import write
from agent.controlplane.models import ModelVersion
from agent.controlplane.schemas import NAME, VERSION
from agent.errors import EdgeAgentError, ModelError
from agent.fleet.agent_release import RELEASE_NAME

MAX_FINDINGS_AUDITED = 20


class BadName(EdgeAgentError):
    """A model name or version the service does not take (HTTP 422 at the edge)."""


def check_names(name: str, version: str) -> None:
    if not re.match(NAME, name):
        raise BadName(f"name: invalid model name {name[:80]!r} (letters, digits, '.', '_', '-'; at most 64)")
    if name == RELEASE_NAME:
        raise BadName(f"name: {RELEASE_NAME!r} is the agent's releases' name (PUT /api/v1/releases/VERSION)")
    if not re.match(VERSION, version) or len(version) > 64:
        raise BadName(f"version: {version[:80]!r} is not a dotted integer version")


def by_magic(path: Path) -> Path:
    """The received file renamed for what its bytes are: package.tar.gz (gzip) or model.onnx."""
    with open(path, "rb") as f:
        head = f.read(2)
    return path.rename(path.with_name("package.tar.gz" if head == b"\x1f\x8b" else "model.onnx"))


def save_version(
    ctx: Any, name: str, version: str, path: Path, actor: str, checked: dict[str, Any] | None = None
) -> dict[str, Any]:
    """Store the package and record the version (audited `model.upload`, with what the package check found when
    it ran: `checked`; without it the package is validated as it is stored); the same bytes again are a no-op,
    other bytes for a version that exists a Conflict (409)."""
    from agent.fleet.push import store_package

    artifact = store_package(path, ctx.settings.uploads_dir, validate=checked is None)
    with write(ctx.factory) as s:
        old = s.scalar(select(ModelVersion).where(ModelVersion.name == name, ModelVersion.version == version))
        if old is not None and old.sha256 != artifact["sha256"]:
            raise repo.Conflict(f"version: {name} {version} exists with other bytes; upload a new version")
        if old is None:
            s.add(
                ModelVersion(
                    name=name,
                    version=version,
                    sha256=artifact["sha256"],
                    size=artifact["size"],
                    format=artifact["format"],
                    created_at=time.time(),
                )
            )
            extra = {"checked": checked} if checked is not None else {}
            repo.audit(s, actor, "model.upload", f"{name}/{version}", sha256=artifact["sha256"], **extra)
    return {"name": name, "version": version, "sha256": artifact["sha256"], "size": artifact["size"]}


@dataclass
class Received:
    """What became of a dashboard upload: stored (the version's fields) or refused (why), with the findings of
    the package check either way."""

    findings: list[dict[str, str]] = field(default_factory=list)
    stored: dict[str, Any] | None = None
    refused: str | None = None
    status: int = 422


def check_file(path: Path, work: Path) -> tuple[list[dict[str, str]], str | None]:
    """(the findings of `edge-agent package --check` on the file, why it does not load or None): a .tar.gz is
    unpacked first (within the loader's limits) and its directory checked."""
    from agent.package.check import check
    from agent.package.load import extract_archive
    from agent.package.unpack import check_package

    root = path
    try:
        if path.name.endswith(".tar.gz"):
            root = extract_archive(path, work / "unpacked")
        check_package(str(root))  # load_package's checks, or a generative package's (check_generative)
        broken = None
    except ModelError as exc:
        broken = str(exc).replace(str(work) + "/", "")
    found = [f.to_dict() for f in check(root)] if root.exists() else []
    prefix = str(root) + "/" if root.is_dir() else str(root.parent) + "/"
    for f in found:
        f["where"] = f["where"].replace(prefix, "").replace(str(root), path.name)
    return found, broken


def receive(ctx: Any, name: str, version: str, path: Path, actor: str, store_anyway: bool) -> Received:
    """A dashboard upload: checked like `package --check`; stored when it loads and either has no findings or
    the operator chose to store it anyway (as the API stores any package that loads)."""
    try:
        check_names(name, version)
    except BadName as exc:
        return Received(refused=str(exc))
    path = by_magic(path)
    findings, broken = check_file(path, path.parent)
    if broken is not None:
        return Received(findings, refused=f"the package does not load: {broken}")
    if findings and not store_anyway:
        why = f"package --check lists {len(findings)} fix(es): apply them, or tick 'store it anyway'"
        return Received(findings, refused=why)
    try:
        checked = {"fixes": len(findings), "findings": findings[:MAX_FINDINGS_AUDITED], "via": "dashboard"}
        return Received(findings, stored=save_version(ctx, name, version, path, actor, checked=checked))
    except repo.Conflict as exc:
        return Received(findings, refused=str(exc), status=409)
