"""The daemon's frozen settings: resolved once from the config file, the environment and the target.

As uvicorn's `Config.load()`: the caller's explicit choices (tests, the fleet simulator) and the EDGE_AGENT_*
environment win, then the config file's `serving` section, then the target's serving hints. The result is a
frozen `StepConfig`; nothing fills it in later.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping
from typing import Any

from agent.config import AgentConfig
from agent.errors import ConfigError
from agent.lifecycle.parts import StepConfig


def from_env(env: Mapping[str, str] = os.environ, given: StepConfig | None = None) -> StepConfig:
    """`given` (default: nothing set) with the EDGE_AGENT_* test/tuning knobs applied."""
    cfg = given or StepConfig()
    changes: dict[str, Any] = {}
    options = dict(cfg.qualify_options)
    try:
        if env.get("EDGE_AGENT_PROBATION_S"):
            changes["probation_s"] = float(env["EDGE_AGENT_PROBATION_S"])
        if env.get("EDGE_AGENT_QUALIFY_PROVIDERS"):
            changes["providers"] = [p.strip() for p in env["EDGE_AGENT_QUALIFY_PROVIDERS"].split(",") if p.strip()]
        if env.get("EDGE_AGENT_QUALIFY_BUDGET_S"):
            options["latency_budget_s"] = float(env["EDGE_AGENT_QUALIFY_BUDGET_S"])
        if env.get("EDGE_AGENT_QUALIFY_ISOLATE") == "0":
            options["isolate"] = False
    except ValueError as exc:
        raise ConfigError(f"EDGE_AGENT_* environment: {exc}") from None
    return dataclasses.replace(cfg, qualify_options=options, **changes)


def resolve(config: AgentConfig, target: Any, given: StepConfig | None = None) -> StepConfig:
    """What `given` leaves unset comes from the config file (serving.*) and the target (its serving hints)."""
    from agent.serving.memory import resolve_memory_max

    sc, serving = given or StepConfig(), config.serving
    target_serving = target.serving if target is not None else None
    changes: dict[str, Any] = {}
    if target is not None and not sc.serving:
        changes["serving"] = dict(target.serving or {})  # swap + swap_when_memory_short rule
    if sc.probation_s is None:  # EDGE_AGENT_PROBATION_S (tests) wins over the config file
        changes["probation_s"] = serving.probation_s
    if sc.build_nice is None:
        changes["build_nice"] = serving.build_nice
    if sc.memory_max is None:
        changes["memory_max"] = resolve_memory_max(serving.memory_max, target_serving)[0]
    if sc.probation is None:
        changes["probation"] = serving.probation
    if sc.shadow is None:
        changes["shadow"] = serving.shadow
    if sc.model_trust is None:
        from agent.artifacts.modelsig import ModelTrust

        t = config.trust
        changes["model_trust"] = ModelTrust(
            t.model_signing_keys, t.model_signing_certificates, t.model_signing_ignore_paths
        )
    return dataclasses.replace(sc, **changes)
