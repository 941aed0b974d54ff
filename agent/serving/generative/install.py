"""Load the generative models a daemon serves (serving.generative) and put the /v1 routes on its data plane."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from agent.serving.generative.engine import GenerativeModel
from agent.serving.generative.genmetrics import families
from agent.serving.generative.kvbudget import KVBudget
from agent.serving.generative.openai import OpenAIRoutes
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


def model_dir(package: Path, variant: str | None) -> Path:
    """The directory the runtime loads: the package's own model, or the folder model.yaml names for `variant`."""
    from agent.generative.package import load_generative

    pkg = load_generative(package)
    if variant is None:
        return pkg.root
    if variant not in pkg.variants:
        from agent.errors import ConfigError

        raise ConfigError(f"{package}: no variant {variant!r} (model.yaml has: {', '.join(pkg.variants) or 'none'})")
    return pkg.variants[variant]


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
    plane: Any, models: tuple[ModelSetting, ...], kv_budget: int, max_streams: int = 8, queue_s: float = 0.0
) -> GenerationRoutes | None:
    """Load each model (a failure raises: the daemon refuses a config it cannot serve) and route to them."""
    if not models:
        return None
    budget = KVBudget(kv_budget, max_streams, queue_s)
    loaded = {m.name: GenerativeModel(m.name, model_dir(m.package, m.variant), m.provider, budget) for m in models}
    routes = GenerationRoutes(loaded)
    plane.generation = routes
    plane.collectors.append(lambda: families(m.stats for m in loaded.values()))
    return routes
