"""`serving.generative` (docs/generative.md): the generative packages a daemon serves on its inference port.

serving:
  generative:
    kv_budget: 256M                  KV cache all streams in flight may hold together (a request over it: 503)
    stream_interval_ms: 20           a streamed response sends text at most this often (the first piece at once)
    models:
      tiny-lm: {package: /srv/tiny-lm, variant: int8, provider: cpu}    variant and provider optional
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.config.validator import Validator
from agent.errors import ConfigError
from agent.names import is_valid_name

DEFAULT_KV_BUDGET = 256 << 20


@dataclass(frozen=True)
class GenerativeModelConfig:
    name: str
    package: Path
    variant: str | None = None  # a model.yaml variant; None: the package's own (fp32 reference) model
    provider: str = "cpu"  # an onnxruntime-genai provider, or (openvino-genai) an OpenVINO device: cpu -> CPU


@dataclass(frozen=True)
class GenerativeServing:
    models: tuple[GenerativeModelConfig, ...] = ()
    kv_budget: int = DEFAULT_KV_BUDGET
    max_streams: int = 8  # at most half the HTTP front's 16 worker threads, so inference requests keep theirs
    queue_s: float = 0.0  # a request that does not fit waits this long for room (0: refused at once)
    stream_interval_ms: float = 20.0  # a stream's text goes out at most this often (0: a piece a token)


def read_generative(v: Validator, raw: Any) -> GenerativeServing:
    from agent.util.sizes import parse_size

    key = "serving.generative"
    g = v.mapping(
        raw if raw is not None else {}, key, ("models", "kv_budget", "max_streams", "queue_s", "stream_interval_ms")
    )
    budget = DEFAULT_KV_BUDGET
    if g.get("kv_budget") is not None:
        try:
            budget = parse_size(g["kv_budget"])
        except ValueError as exc:
            raise ConfigError(f"{key}.kv_budget: {exc}") from None
    models = []
    for name, spec in _items(g, key):
        where = f"{key}.models.{name}"
        if not is_valid_name(str(name)):
            raise ConfigError(f"{where}: not a valid model name")
        m = v.mapping(spec, where, ("package", "variant", "provider"))
        variant = v.string(m["variant"], f"{where}.variant") if m.get("variant") is not None else None
        models.append(
            GenerativeModelConfig(
                str(name),
                v.path(m.get("package"), f"{where}.package"),
                variant,
                v.string(m.get("provider", "cpu"), f"{where}.provider"),
            )
        )
    streams = v.integer(g.get("max_streams", 8), f"{key}.max_streams", 1, 12)  # the HTTP front has 16 workers
    queue_s = v.number(g.get("queue_s", 0.0), f"{key}.queue_s", 0.0, 600.0)
    interval = v.number(g.get("stream_interval_ms", 20.0), f"{key}.stream_interval_ms", 0.0, 1000.0)
    return GenerativeServing(tuple(models), budget, streams, queue_s, interval)


def _items(g: dict[str, Any], key: str) -> list[tuple[str, Any]]:
    raw = g.get("models") or {}
    if not isinstance(raw, dict):
        raise ConfigError(f"{key}.models: expected a mapping of name -> {{package, variant, provider}}")
    return [(str(k), val) for k, val in raw.items()]
