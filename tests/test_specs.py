"""The typed specs of the three long calls (issue 35): a row's RowSpec crosses to its worker as one pickle,
QualifyOptions and PushSpec refuse a bad field when built, before anything is measured, stored or signed."""

from __future__ import annotations

import pickle
from dataclasses import replace
from types import SimpleNamespace

import numpy as np
import pytest

from agent.errors import ConfigError, ManifestError
from agent.fleet.pushspec import PushSpec
from agent.qualify.options import QualifyOptions
from agent.qualify.rowspec import RowSpec
from agent.transport.mqtt import BrokerConfig

FEEDS = {"x": np.arange(6, dtype=np.float32).reshape(2, 3)}


def _row(**changes) -> RowSpec:
    base = RowSpec(
        model_path="/m/model.onnx",
        provider="cpu",
        options={"intra_op_num_threads": 1},
        precision=None,
        device=None,
        cache_dir=None,
        feeds=FEEDS,
        reference={"y": np.ones(3, dtype=np.float32)},
        tolerances={None: {"max_abs": 1e-5}},
        budget_s=0.5,
    )
    return replace(base, **changes)


def test_a_row_spec_crosses_to_the_worker_as_one_pickle():
    spec = _row(latency_feeds={"x": np.zeros((4, 3), dtype=np.float32)}, row_timeout_s=30.0)
    back = pickle.loads(pickle.dumps(spec))
    assert type(back) is RowSpec and back.provider == "cpu" and back.row_timeout_s == 30.0
    assert np.array_equal(back.feeds["x"], FEEDS["x"]) and back.timed["x"].shape == (4, 3)
    assert back.session_key == ("/m/model.onnx", "cpu", None, None, None)
    assert _row().timed is _row().feeds  # no opt shape declared: latency on the accuracy inputs
    kept = spec.kept()
    assert kept.keep and not spec.keep and kept.feeds is spec.feeds  # the same row, its session kept after


def test_a_row_spec_refuses_what_the_parent_could_not_have_meant():
    with pytest.raises(ValueError, match="lacks outputs"):
        _row(original={"path": "/m/orig.onnx", "file": "orig.onnx", "sets": []})
    with pytest.raises(ValueError, match="row_timeout_s"):
        _row(row_timeout_s=0.0)
    with pytest.raises(ValueError, match="provider"):
        _row(provider="")


def test_qualify_options_are_checked_once_when_built():
    assert QualifyOptions(deadline_s=0.0).deadline_s == 0.0  # a spent budget is a row at stage "budget", not an error
    for bad, match in (
        ({"latency_budget_s": 0}, "latency_budget_s"),
        ({"row_timeout_s": -1.0}, "row_timeout_s"),
        ({"memory_max": 0}, "memory_max"),
        ({"deadline_s": -5.0}, "deadline_s"),
        ({"latency_budget_s": float("nan")}, "latency_budget_s"),
    ):
        with pytest.raises(ConfigError, match=match):
            QualifyOptions(**bad)
    with pytest.raises(ValueError, match="unknown optimisation 'turbo'"):
        QualifyOptions(optimize=["turbo"])
    target = SimpleNamespace(optimize=["slim"])
    assert QualifyOptions().kinds(target) == ("slim",)  # None: the target's
    assert QualifyOptions(optimize=["fusions"]).kinds(target) == ("fusions",)
    assert QualifyOptions(optimize=False).kinds(target) == ()


def _push(**changes) -> PushSpec:
    fields = {
        "name": "tiny",
        "version": "2.0.1",
        "key_file": "fleet.key",
        "store": "store",
        "broker": BrokerConfig("mqtt://127.0.0.1:1"),
        "devices": ["dev-1"],
        **changes,
    }
    return PushSpec(**fields)


def test_a_push_spec_names_its_topics_and_keeps_its_targets_frozen():
    spec = _push(devices=["dev-1", "dev-2"], prefix="lab")
    assert spec.devices == ("dev-1", "dev-2") and spec.groups == ()
    assert spec.topics == ["lab/devices/dev-1/desired/tiny", "lab/devices/dev-2/desired/tiny"]
    assert _push(devices=(), groups=["g"]).topics == ["edge/groups/g/desired/tiny"]


def test_a_push_spec_refuses_bad_targets_names_and_numbers_before_anything_is_stored():
    with pytest.raises(ConfigError, match="one of the two"):
        _push(groups=["lab"])  # devices and groups
    with pytest.raises(ConfigError, match="one of the two"):
        _push(devices=())  # neither
    with pytest.raises(ConfigError, match="device id"):
        _push(devices=["a/b"])
    with pytest.raises(ConfigError, match="group"):
        _push(devices=(), groups=["+"])
    with pytest.raises(ConfigError, match="model name"):
        _push(name="a b")
    with pytest.raises(ManifestError, match="invalid version"):
        _push(version="2.x")
    for bad, match in (({"chunk_size": 0}, "--chunk-size"), ({"ttl_s": 0}, "--ttl"), ({"wait": -1.0}, "--wait")):
        with pytest.raises(ConfigError, match=match):
            _push(**bad)
