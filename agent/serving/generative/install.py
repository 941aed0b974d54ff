"""Load the generative models a daemon serves (serving.generative) and put the /v1 routes on its data plane."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from agent.serving.generative.engine import OV_GENAI, EngineSpec, GenerativeModel
from agent.serving.generative.genmetrics import families
from agent.serving.generative.host import GenerativeHost
from agent.serving.generative.openai import OpenAIRoutes
from agent.serving.generative.ovgenai import DEVICE_DEFAULT
from agent.serving.generative.pacing import DEFAULT_STREAM_INTERVAL_S
from agent.serving.generative.triton import generate
from agent.serving.http.handlers import Response


class ModelSetting(Protocol):
    """config.GenerativeModelConfig (serving/ never imports the settings loader)."""

    @property
    def name(self) -> str: ...

    @property
    def package(self) -> Path: ...

    @property
    def variant(self) -> str | None: ...

    @property
    def provider(self) -> str: ...


def model_dir(package: Path, variant: str | None) -> tuple[Path, EngineSpec]:
    """The directory the runtime loads (the package's own model, or the folder model.yaml names for `variant`) and
    how: the package's runtime and max_length; for openvino-genai `variant: device-default` is the package's own
    model compiled with the device's own precision hints (qualification's row of that name)."""
    from agent.generative.package import load_generative

    pkg = load_generative(package)
    spec = EngineSpec(pkg.runtime, variant or "fp32", pkg.max_length)
    if variant is None or (pkg.runtime == OV_GENAI and variant == DEVICE_DEFAULT):
        return pkg.root, spec
    if variant not in pkg.variants:
        from agent.errors import ConfigError

        raise ConfigError(f"{package}: no variant {variant!r} (model.yaml has: {', '.join(pkg.variants) or 'none'})")
    return pkg.variants[variant], spec


class GenerationRoutes:
    """The plane's generation hook: Triton's /v2/models/M/generate[_stream], else the OpenAI-compatible /v1."""

    def __init__(self, models: dict[str, GenerativeModel]) -> None:
        self.models = models
        self.openai = OpenAIRoutes(models)

    def __call__(self, method: str, path: str, body: bytes | memoryview) -> Response:
        if path.startswith("/v2/models/"):
            return generate(self.models, method, path.split("?", 1)[0], body)
        return self.openai(method, path, body)


def install(
    plane: Any,
    models: tuple[ModelSetting, ...],
    kv_budget: int,
    max_streams: int = 8,
    queue_s: float = 0.0,
    host: GenerativeHost | None = None,
    stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S,
) -> GenerationRoutes | None:
    """Load each configured model into `host` (a failure raises: the daemon refuses a config it cannot serve) and
    route to what the host serves (the models of serving.generative, and those deployed through the lifecycle:
    the daemon's registry holds the host: routed even while it serves nothing yet). None when there is neither."""
    if not models and host is None:
        return None
    host = host if host is not None else GenerativeHost()
    host.configure(kv_budget, max_streams, queue_s, stream_interval_s)
    for m in models:
        from agent.generative.package import load_generative

        version = load_generative(m.package).version
        where, spec = model_dir(m.package, m.variant)
        host.swap(m.name, host.load(m.name, version, where, m.provider, spec))
    routes = GenerationRoutes(host.models)
    plane.generation = routes
    plane.collectors.append(lambda: families(m.stats for m in host.models.values()) if host.models else [])
    return routes
