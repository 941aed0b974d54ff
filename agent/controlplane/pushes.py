"""A push through the service: the uploaded model version signed with the service's fleet key and published as
retained desired state for devices or groups, by agent.fleet.push (the same code as `fleet push`)."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

from sqlalchemy import select

from agent.controlplane import repo
from agent.controlplane.db import write
from agent.controlplane.models import ModelVersion


def push_version(ctx, body, actor: str) -> dict[str, Any]:
    from agent.artifacts.store import ContentStore
    from agent.fleet.push import push
    from agent.fleet.pushspec import PushSpec
    from agent.transport.mqtt import BrokerConfig

    settings = ctx.settings
    if not settings.broker_url:
        raise repo.Conflict("mqtt.url: the service has no broker configured: nothing can be published")
    if settings.signing_key is None:
        raise repo.Conflict("signing_key: the service has no fleet signing key configured")
    with ctx.factory() as s:
        mv = s.scalar(select(ModelVersion).where(ModelVersion.name == body.model, ModelVersion.version == body.version))
        if mv is None:
            raise repo.NotFound(f"version: {body.model} {body.version} is not uploaded (PUT /api/v1/models/...)")
        sha, fmt = mv.sha256, mv.format
    with tempfile.TemporaryDirectory() as tmp:
        link = Path(tmp) / ("package.tar.gz" if fmt == "tar.gz" else "model.onnx")
        os.symlink(ContentStore(settings.uploads_dir).path(sha), link)
        spec = PushSpec(
            name=body.model,
            version=body.version,
            key_file=settings.signing_key,
            store=settings.uploads_dir,
            broker=BrokerConfig(settings.broker_url),
            prefix=settings.prefix,
            devices=body.devices,
            groups=body.groups,
            rollback=body.rollback,
            validate=False,
        )
        doc = push(link, spec)
    with write(ctx.factory) as s:
        action = "model.rollback" if body.rollback else "model.push"
        repo.audit(s, actor, action, f"{body.model}/{body.version}", devices=body.devices, groups=body.groups)
    return doc
