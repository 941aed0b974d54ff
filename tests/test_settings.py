"""agent.settings: the lifecycle settings are resolved once (caller, EDGE_AGENT_* environment, config file, target)
and frozen afterwards."""

from __future__ import annotations

import dataclasses

import pytest

from agent import settings
from agent.config import parse_config
from agent.errors import ConfigError
from agent.lifecycle.steps import StepConfig
from agent.targets import get_target
from agent.trial.settings import ProbationConfig


def _config(**serving):
    return parse_config({"device_id": "d", "state_dir": "/tmp/unused", "serving": serving})


def test_environment_knobs_apply_over_what_the_caller_gave():
    env = {
        "EDGE_AGENT_PROBATION_S": "0.5",
        "EDGE_AGENT_QUALIFY_PROVIDERS": "cpu, openvino,",
        "EDGE_AGENT_QUALIFY_BUDGET_S": "0.1",
        "EDGE_AGENT_QUALIFY_ISOLATE": "0",
    }
    got = settings.from_env(env, StepConfig(keep_deployments=3, qualify_options={"x": 1}))
    assert (got.probation_s, got.providers, got.keep_deployments) == (0.5, ["cpu", "openvino"], 3)
    assert got.qualify_options == {"x": 1, "latency_budget_s": 0.1, "isolate": False}
    assert settings.from_env({}) == StepConfig()


def test_a_bad_environment_value_names_the_variables():
    with pytest.raises(ConfigError, match="EDGE_AGENT_"):
        settings.from_env({"EDGE_AGENT_PROBATION_S": "soon"})


def test_the_file_and_the_target_fill_what_the_caller_left_unset():
    target = get_target("generic-x86_64")
    cfg = _config(probation_s=5, build_nice=3, probation={"ratio": 2})
    got = settings.resolve(cfg, target)
    assert (got.probation_s, got.build_nice) == (5.0, 3)
    assert got.probation == cfg.serving.probation and got.probation.ratio == 2
    assert got.shadow == cfg.serving.shadow
    assert got.serving == dict(target.serving or {})
    given = StepConfig(probation_s=0.3, probation=ProbationConfig(), serving={"swap": "stop-then-start"})
    mine = settings.resolve(cfg, target, given)
    assert (mine.probation_s, mine.probation, mine.serving) == (0.3, ProbationConfig(), {"swap": "stop-then-start"})
    assert mine.build_nice == 3  # unset by the caller: the file's


def test_resolved_settings_are_frozen():
    got = settings.resolve(_config(), None)
    with pytest.raises(dataclasses.FrozenInstanceError):
        got.probation_s = 1.0  # type: ignore[misc]
