"""serving.probation and serving.shadow: defaults, overrides, `shadow: false`, and errors naming the key path."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent.config import parse_config
from agent.errors import ConfigError
from agent.trial.settings import ProbationConfig, ShadowConfig


def _serving(tmp_path: Path, serving: dict):
    return parse_config({"device_id": "d", "state_dir": str(tmp_path), "serving": serving}, base_dir=tmp_path)


def test_defaults_and_overrides(tmp_path):
    s = _serving(tmp_path, {}).serving
    assert s.probation == ProbationConfig() and s.shadow == ShadowConfig() and s.probation_s == 60.0
    s = _serving(
        tmp_path,
        {"probation_s": 5, "probation": {"ratio": 2, "quantiles": [99, 50]}, "shadow": {"requests": 10}},
    ).serving
    assert (s.probation_s, s.probation.ratio, s.probation.quantiles) == (5.0, 2.0, (50, 99))
    assert s.shadow.requests == 10 and s.shadow.enabled
    assert _serving(tmp_path, {"shadow": False}).serving.shadow.enabled is False


@pytest.mark.parametrize(
    "serving, message",
    [
        ({"probation": {"ratio": 0.5}}, "serving.probation.ratio: expected a number 1-100"),
        ({"probation": {"quantiles": [75]}}, "serving.probation.quantiles: expected a non-empty list of 50, 90 and 99"),
        ({"probation": {"quantiles": 90}}, "serving.probation.quantiles"),
        ({"probation": {"alpha": "low"}}, "serving.probation.alpha"),
        ({"probation": {"refere": True}}, "serving.probation.refere: unknown key (did you mean 'referee'?)"),
        ({"probation": {"referee": "yes"}}, "serving.probation.referee: expected true or false"),
        ({"probation": 3}, "serving.probation: expected a mapping"),
        ({"shadow": {"cpu_share": 2}}, "serving.shadow.cpu_share: expected a number 0.001-1"),
        ({"shadow": {"requests": 0}}, "serving.shadow.requests"),
        ({"shadow": {"max_rel": -1}}, "serving.shadow.max_rel"),
        ({"shadow": "on"}, "serving.shadow: expected a mapping"),
    ],
)
def test_bad_values_name_the_key(tmp_path, serving, message):
    with pytest.raises(ConfigError, match=re.escape(message)):
        _serving(tmp_path, serving)
