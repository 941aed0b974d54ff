"""Hostile files (issue 29, items 3-5 and the token length): one key for one device, a token file that is not
UTF-8 or too short, YAML aliases ("billion laughs"), declared dims of 10^12. Each is refused with the file or
key named, never an exception past the loader."""

from __future__ import annotations

import json
import os
import time

import pytest
from clirunner import edge_agent as cli
from support.daemon import write_config

from agent.artifacts.keys import device_key, public_pem
from agent.config import MIN_TOKEN_CHARS, load_config
from agent.errors import ConfigError, ModelError
from agent.fleet.registry import KEY_OF_ANOTHER, DeviceRegistry
from agent.package.load import load_package
from agent.samples import write_package
from agent.transport.signing import sign_doc

BAD_BYTES = bytes(range(128, 256)) * 8  # random-looking, not UTF-8


def _pem(tmp_path, name):
    return public_pem(device_key(tmp_path / name).public_key())


# ------------------------------------------------------------------ one key, one device
def test_a_key_held_by_another_device_is_refused_and_replace_moves_it(tmp_path):
    reg = DeviceRegistry({}, tmp_path / "registry.json")
    a = _pem(tmp_path, "a")
    reg.register("dev-a", a, ["lab"])
    reg.register("dev-a", a, ["lab", "x"])  # the same device again: fine
    with pytest.raises(ConfigError, match="already registered to device dev-a.*--replace"):
        reg.register("dev-b", a, ["lab"])
    assert set(reg.devices) == {"dev-a"}
    entry = reg.register("dev-b", a, ["lab"], replace=True)
    assert entry["revoked"] == ["dev-a"] and set(reg.devices) == {"dev-b"}


def test_register_cli_refuses_a_shared_key(tmp_path):
    store = tmp_path / "store"
    pub = tmp_path / "a.pub"
    pub.write_text(_pem(tmp_path, "a"))
    ok = cli("fleet", "register", "dev-a", "--public-key", pub, "--store", store, timeout=120)
    assert ok.returncode == 0, ok.stderr
    refused = cli("fleet", "register", "dev-b", "--public-key", pub, "--store", store, timeout=120)
    assert refused.returncode != 0 and "already registered to device dev-a" in refused.stderr, refused.stderr
    moved = cli("fleet", "register", "dev-b", "--public-key", pub, "--store", store, "--replace", "--json")
    assert moved.returncode == 0, moved.stderr
    assert json.loads(moved.stdout)["revoked"] == ["dev-a"]
    assert set(json.loads((store / "registry.json").read_text())["devices"]) == {"dev-b"}
    bad = tmp_path / "bad.pub"
    bad.write_bytes(BAD_BYTES)
    out = cli("fleet", "register", "dev-c", "--public-key", bad, "--store", store)
    assert out.returncode != 0 and "not UTF-8" in out.stderr and "Traceback" not in out.stderr, out.stderr


def test_a_status_signed_by_a_key_registered_to_another_device_is_not_counted(tmp_path):
    """A registry written before keys were unique holds one key twice: neither device's reports count."""
    key = device_key(tmp_path / "a")
    pem = public_pem(key.public_key())
    reg = DeviceRegistry({}, tmp_path / "registry.json")
    reg.register("dev-a", pem)
    reg.devices["dev-b"] = dict(reg.devices["dev-a"])  # as an old registry file could hold it
    doc = sign_doc({"device_id": "dev-b", "ts": time.time(), "models": {"m": {"version": "9"}}}, key)
    shown = reg.apply("dev-b", doc)
    assert shown["trust"] == KEY_OF_ANOTHER and "models" not in shown
    assert reg.trust("dev-a", sign_doc({"device_id": "dev-a"}, key)) == KEY_OF_ANOTHER


# ------------------------------------------------------------------ token files
def _config_with_token(tmp_path, data: bytes):
    token = tmp_path / "token"
    token.write_bytes(data)
    token.chmod(0o600)
    return write_config(tmp_path, extra={"serving": {"host": "127.0.0.1", "port": 0, "token_file": str(token)}})


def test_a_token_file_that_is_not_utf8_is_named_by_config_check_and_start_up(tmp_path):
    cfg = _config_with_token(tmp_path, BAD_BYTES)
    with pytest.raises(ConfigError, match=r"serving.token_file: .*token: not UTF-8 text \(byte 0x80 at offset 0\)"):
        load_config(cfg)
    check = cli("config", "check", cfg, "--json", timeout=120)
    assert check.returncode == 2 and "not UTF-8" in json.loads(check.stdout)["error"]
    run = cli("run", "--config", cfg, timeout=120)  # start-up: exits with the file and the reason
    assert run.returncode == 2, run.stderr
    assert f"serving.token_file: {tmp_path / 'token'}: not UTF-8 text" in run.stderr
    assert "Traceback" not in run.stderr and "internal error" not in run.stderr


def test_a_short_token_is_refused(tmp_path):
    cfg = _config_with_token(tmp_path, b"x" * (MIN_TOKEN_CHARS - 1) + b"\n")
    check = cli("config", "check", cfg, timeout=120)
    assert check.returncode == 2 and f"at least {MIN_TOKEN_CHARS} are required" in check.stderr, check.stderr
    (tmp_path / "token").write_bytes(b"x" * MIN_TOKEN_CHARS + b"\n")
    assert load_config(cfg).serving.token() == "x" * MIN_TOKEN_CHARS


def test_a_fifo_token_file_does_not_hang_the_loader(tmp_path):
    token = tmp_path / "token"
    os.mkfifo(token)
    cfg = write_config(tmp_path, extra={"serving": {"host": "127.0.0.1", "port": 0, "token_file": str(token)}})
    with pytest.raises(ConfigError, match="expected a regular file|not a regular file"):
        load_config(cfg)


# ------------------------------------------------------------------ YAML
LAUGHS = "a: &a [x, x, x, x, x, x, x, x, x, x]\n" + "".join(
    f"{chr(98 + i)}: &{chr(98 + i)} [{', '.join(['*' + chr(97 + i)] * 10)}]\n" for i in range(8)
)


def test_yaml_aliases_are_refused_in_the_config(tmp_path):
    cfg = tmp_path / "agent.yaml"
    cfg.write_text("device_id: dev-1\n" + LAUGHS)
    with pytest.raises(ConfigError, match=r"agent.yaml: line 3 column \d+ invalid YAML: alias \*a refused"):
        load_config(cfg)


def _dynamic_model():
    from onnx import TensorProto, helper

    graph = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["y"])],
        "dyn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["N", 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["N", 4])],
    )
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_billion_laughs_model_yaml_is_refused_naming_the_file(tmp_path):
    pkg = write_package(tmp_path / "p", _dynamic_model(), name="dyn", golden=False)
    (pkg / "model.yaml").write_text("name: dyn\nversion: '1'\ndescription:\n" + LAUGHS.replace("a:", " a:", 1))
    with pytest.raises(ModelError, match=r"model.yaml: .*model.yaml: line \d+ column \d+ invalid YAML: alias"):
        load_package(pkg)
    (pkg / "model.yaml").write_bytes(b"name: dyn\n" + BAD_BYTES)
    with pytest.raises(ModelError, match="model.yaml: .*not UTF-8"):
        load_package(pkg)


@pytest.mark.parametrize(
    ("extra", "key"),
    [
        ({"dynamic_dims": {"N": 10**12}}, "dynamic_dims.N"),
        ({"input_shapes": {"x": [10**12, 4]}}, "input_shapes.x"),
        ({"input_shapes": {"x": {"min": [1, 4], "opt": [2, 4], "max": [10**12, 4]}}}, "input_shapes.x.max"),
    ],
)
def test_declared_dims_over_the_memory_budget_name_the_key(tmp_path, extra, key):
    pkg = write_package(tmp_path / "p", _dynamic_model(), name="dyn", golden=False, extra_yaml=extra)
    with pytest.raises(ModelError, match=rf"model.yaml: {key}: input 'x' of shape .* over the memory budget"):
        load_package(pkg)
    ok = write_package(
        tmp_path / "q", _dynamic_model(), name="dyn", golden=False, extra_yaml={"dynamic_dims": {"N": 8}}
    )
    assert load_package(ok).dynamic_dims == {"N": 8}


def test_a_trusted_key_file_that_is_not_a_key_is_named(tmp_path):
    bad = tmp_path / "fleet.pub"
    for data, why in ((BAD_BYTES, "not UTF-8"), (b"hello\n", "not an Ed25519 public key")):
        bad.write_bytes(data)
        cfg = write_config(tmp_path, extra={"trust": {"public_keys": [str(bad)]}})
        check = cli("config", "check", cfg, timeout=120)
        assert check.returncode == 2 and f"trust.public_keys[0]: {bad}" in check.stderr, check.stderr
        assert why in check.stderr and "Traceback" not in check.stderr
