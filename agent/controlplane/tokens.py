"""Operator and enrollment tokens: made random, stored only as their SHA-256, checked by role."""

from __future__ import annotations

import hashlib
import secrets
import time

from sqlalchemy import select
from sqlalchemy.orm import Session

from agent.controlplane.models import ROLES, EnrollToken, OperatorToken
from agent.errors import ConfigError

RANK = {role: i for i, role in enumerate(ROLES)}
PREFIX = "eacp_"


def digest(token: str) -> str:
    return hashlib.sha256(token.encode("utf-8", "replace")).hexdigest()


def new_token() -> str:
    return PREFIX + secrets.token_urlsafe(32)


def create_operator(session: Session, name: str, role: str) -> str:
    """A new operator token (returned once; only its hash is stored)."""
    if role not in ROLES:
        raise ConfigError(f"role: expected one of {', '.join(ROLES)}, got {role!r}")
    if session.scalar(select(OperatorToken).where(OperatorToken.name == name)) is not None:
        raise ConfigError(f"name: an operator token named {name!r} exists already")
    token = new_token()
    session.add(OperatorToken(token_hash=digest(token), name=name, role=role, created_at=time.time()))
    return token


def operator(session: Session, token: str | None) -> OperatorToken | None:
    if not token:
        return None
    return session.get(OperatorToken, digest(token))


def allows(role: str, needed: str) -> bool:
    return RANK.get(role, -1) >= RANK[needed]


def create_enroll_token(session: Session, name: str, groups: list[str], uses: int, by: str) -> str:
    token = new_token()
    session.add(
        EnrollToken(
            token_hash=digest(token),
            name=name,
            groups=list(groups),
            uses_left=uses,
            created_by=by,
            created_at=time.time(),
        )
    )
    return token
