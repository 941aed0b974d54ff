"""PushSpec: what `fleet push` publishes, to whom and over which transport (agent.fleet.push.push), checked once
when built: the names, the version and the targets are valid before anything is stored or signed."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from agent.artifacts.manifest import parse_version
from agent.errors import ConfigError
from agent.transport.mqtt import BrokerConfig
from agent.transport.topics import DEFAULT_PREFIX, check_name

DEFAULT_CHUNK = 256 * 1024
DEFAULT_TTL_S = 30 * 86400


@dataclass(frozen=True)
class PushSpec:
    """The model `name` at `version`, for the `devices` or the `groups` (one of the two, never both), signed with
    the fleet key in `key_file` and stored in the control-plane content `store`; published on `broker` under
    `prefix`, with an http(s) source too when `http_url` is given ('{sha256}' is replaced), in `chunk_size`-byte
    chunks. The manifest lives `ttl_s` seconds, may be older than what a device runs when `rollback`, and carries
    the `qualification` overrides. `wait`: seconds to wait for every targeted device to run it (None: publish
    only); `validate`: load the package first (checker and shape inference); `delta`: the manifest carries the
    chunk recipe devices use to fetch only what changed (agent.artifacts.delta)."""

    name: str
    version: str
    key_file: str | os.PathLike[str]
    store: str | os.PathLike[str]
    broker: BrokerConfig
    prefix: str = DEFAULT_PREFIX
    devices: Sequence[str] = ()
    groups: Sequence[str] = ()
    http_url: str | None = None
    chunk_size: int = DEFAULT_CHUNK
    ttl_s: int = DEFAULT_TTL_S
    rollback: bool = False
    qualification: dict[str, Any] | None = None
    wait: float | None = None
    validate: bool = True
    delta: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "devices", tuple(self.devices))  # frozen: a list given (the CLI, the API) is copied
        object.__setattr__(self, "groups", tuple(self.groups))
        check_name(self.name, "model name", ConfigError)
        parse_version(self.version)
        if bool(self.devices) == bool(self.groups):
            raise ConfigError("give the targets with --device ID or with --group G (one of the two)")
        for d in self.devices:
            check_name(d, "device id", ConfigError)
        for g in self.groups:
            check_name(g, "group", ConfigError)
        if self.chunk_size <= 0:
            raise ConfigError(f"--chunk-size: must be more than 0 bytes, got {self.chunk_size}")
        if self.ttl_s <= 0:
            raise ConfigError(f"--ttl: must be more than 0 seconds, got {self.ttl_s}")
        if self.wait is not None and self.wait < 0:
            raise ConfigError(f"--wait: must be 0 seconds or more, got {self.wait:g}")

    @property
    def topics(self) -> list[str]:
        """The retained desired-state topics it is published on: each device's, then each group's."""
        from agent.transport.topics import Topics

        t = Topics(self.prefix)
        return [t.device_desired(d, self.name) for d in self.devices] + [
            t.group_desired(g, self.name) for g in self.groups
        ]
