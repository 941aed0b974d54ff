"""The inference protocol's front ends on one data plane: the HTTP server, and the gRPC one when a port is set."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from agent.serving.dataplane import DataPlane
    from agent.serving.generative.install import ModelSetting
    from agent.serving.grpc.front import GRPCServer
    from agent.serving.http.server import OIPServer


class FrontSettings(Protocol):
    """What the front ends take from the serving settings (config.ServingConfig has these: serving/ never imports
    the settings loader)."""

    @property
    def host(self) -> str: ...

    @property
    def port(self) -> int: ...

    @property
    def grpc_port(self) -> int | None: ...

    @property
    def max_connections(self) -> int: ...

    @property
    def max_per_peer(self) -> int: ...

    @property
    def header_timeout_s(self) -> float: ...

    @property
    def idle_timeout_s(self) -> float: ...

    @property
    def shm_in_place(self) -> bool: ...

    @property
    def generative(self) -> GenerativeSettings: ...

    def token(self) -> str | None: ...


class GenerativeSettings(Protocol):
    """config.GenerativeServing: the generative models served on the inference port (docs/generative.md)."""

    @property
    def models(self) -> tuple[ModelSetting, ...]: ...

    @property
    def kv_budget(self) -> int: ...

    @property
    def max_streams(self) -> int: ...

    @property
    def queue_s(self) -> float: ...

    @property
    def stream_interval_ms(self) -> float: ...


def start_fronts(
    registry: Any, s: FrontSettings, extend: Callable[[DataPlane], None] | None = None, memory_max: int | None = None
) -> tuple[OIPServer, GRPCServer | None]:
    """(HTTP server, gRPC server or None), both started; `extend(plane)` installs extensions (the repository)
    on the shared data plane before the gRPC front opens. memory_max (serving.memory_max, resolved) sizes the
    request memory budget both share (server.body_budget_for)."""
    from agent.serving.http.server import OIPServer, body_budget_for

    server = OIPServer(
        registry,
        s.host,
        s.port,
        s.token(),
        max_connections=s.max_connections,
        max_per_peer=s.max_per_peer,
        header_timeout=s.header_timeout_s,
        idle_timeout=s.idle_timeout_s,
        body_budget_bytes=body_budget_for(memory_max),
        shm_in_place=s.shm_in_place,
    ).start()
    if extend is not None:
        extend(server.plane)
    host = getattr(registry, "generative", None)  # generative versions the lifecycle deploys (docs/generative.md)
    if s.generative.models or host is not None:  # the /v1 OpenAI-compatible routes
        from agent.serving.generative.install import install

        g = s.generative
        install(server.plane, g.models, g.kv_budget, g.max_streams, g.queue_s, host, g.stream_interval_ms / 1000)
    if s.grpc_port is None:
        return server, None
    from agent.serving.grpc.front import GRPCServer

    return server, GRPCServer(server.plane, s.host, s.grpc_port, idle_timeout=s.idle_timeout_s).start()
