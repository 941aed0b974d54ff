"""Request bodies of the HTTP API (pydantic: a malformed field gets a 422 naming it)."""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$"
VERSION = r"^[0-9]+(\.[0-9]+)*$"
COUNT = r"^([0-9]+|[0-9]+(\.[0-9]+)?%)$"


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


class Decide(Strict):
    groups: list[str] | None = Field(default=None, max_length=64)


class NewDevice(Strict):
    device_id: str = Field(pattern=NAME)
    public_key: str = Field(max_length=4096)
    groups: list[str] = Field(default_factory=list, max_length=64)


class Groups(Strict):
    groups: list[str] = Field(max_length=64)


class NewOperatorToken(Strict):
    name: str = Field(pattern=NAME)
    role: Literal["viewer", "operator", "admin"]


class NewEnrollToken(Strict):
    name: str = Field(pattern=NAME)
    groups: list[str] = Field(default_factory=list, max_length=64)
    uses: int = Field(default=1, ge=1, le=100000)


class NewRollout(Strict):
    kind: Literal["model", "agent"] = "model"  # agent: a release of edge-agent (PUT /api/v1/releases/VERSION)
    model: str | None = Field(default=None, pattern=NAME)  # required for kind model; none for kind agent
    version: str = Field(pattern=VERSION, max_length=64)
    group: str | None = Field(default=None, pattern=NAME)
    cohort_by: Literal["target", "provider"] | None = None
    canary: str = Field(default="1", pattern=COUNT)
    wave_size: str = Field(default="25%", pattern=COUNT)
    max_failures: str = Field(default="0%", pattern=COUNT)
    deadline_s: float = Field(default=600.0, gt=0, le=7 * 86400)
    rate_per_minute: float | None = Field(default=None, gt=0, le=1e6)
    min_devices: int = Field(default=0, ge=0, le=1_000_000)


class Push(Strict):
    model: str = Field(pattern=NAME)
    version: str = Field(pattern=VERSION, max_length=64)
    groups: list[str] = Field(default_factory=list, max_length=64)
    devices: list[str] = Field(default_factory=list, max_length=10000)
    rollback: bool = False  # signed as a rollback: devices accept the older version (`fleet rollback`)
