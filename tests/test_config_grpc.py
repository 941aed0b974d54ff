"""serving.grpc_port: default 8001, a free port when serving.port is 0, null turns gRPC off, range checked."""

from __future__ import annotations

import pytest
import yaml

from agent.config import load_config
from agent.errors import ConfigError


def _cfg(tmp_path, serving: dict):
    path = tmp_path / "agent.yaml"
    path.write_text(yaml.safe_dump({"device_id": "d", "state_dir": str(tmp_path / "s"), "serving": serving}))
    return load_config(path).serving


@pytest.mark.parametrize(
    ("serving", "want"),
    [
        ({}, 8001),
        ({"port": 9000}, 8001),
        ({"port": 0}, 0),
        ({"grpc_port": 9001}, 9001),
        ({"port": 0, "grpc_port": 7001}, 7001),
        ({"grpc_port": None}, None),
    ],
)
def test_grpc_port(tmp_path, serving, want):
    assert _cfg(tmp_path, serving).grpc_port == want


@pytest.mark.parametrize("bad", [-1, 70000, "x", 1.5])
def test_bad_grpc_port_names_the_key(tmp_path, bad):
    with pytest.raises(ConfigError, match="serving.grpc_port"):
        _cfg(tmp_path, {"grpc_port": bad})
