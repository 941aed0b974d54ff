"""The control plane's config file: defaults, relative paths, errors that name the key; the CLI's token command."""

from __future__ import annotations

import pytest
from clirunner import edge_agent

from agent.controlplane.settings import load, parse
from agent.errors import ConfigError


def test_defaults_and_relative_paths(tmp_path):
    s = parse({"store": "st", "signing_key": "k/fleet.key"}, tmp_path)
    assert s.store == tmp_path / "st" and s.signing_key == tmp_path / "k" / "fleet.key"
    assert s.database_url == f"sqlite:///{tmp_path / 'control-plane.db'}"
    assert s.admin_token_file == tmp_path / "admin.token" and s.port == 8470 and s.broker_url is None


@pytest.mark.parametrize(
    "doc, key",
    [
        ({"listen": {"port": 70000}}, "listen.port"),
        ({"database": {"url": "mysql://x"}}, "database.url"),
        ({"surprise": 1}, "surprise"),
        ({"max_body_bytes": 10}, "max_body_bytes"),
        ({"tick_s": 0}, "tick_s"),
        ({"mqtt": "mqtt://x"}, "mqtt"),
        ({"limits": [1]}, "limits"),
        ({"limits": {"pending_cap": 5}}, "limits.pending_cap"),
        ({"limits": {"enroll_body_bytes": 100}}, "limits.enroll_body_bytes"),
        ({"limits": {"json_depth": True}}, "limits.json_depth"),
        ({"limits": {"key_per_minute": 0}}, "limits.key_per_minute"),
    ],
)
def test_errors_name_the_key(tmp_path, doc, key):
    with pytest.raises(ConfigError, match=f"^{key}"):
        parse(doc, tmp_path)


def test_limits_default_and_set(tmp_path):
    from agent.controlplane.limits import Limits

    assert parse({}, tmp_path).limits == Limits()
    got = parse({"limits": {"pending_max": 5, "address_per_minute": 0.5, "hardware_bytes": 4096}}, tmp_path).limits
    assert (got.pending_max, got.address_per_minute, got.hardware_bytes, got.json_depth) == (5, 0.5, 4096, 32)


def test_unreadable_files_are_clear(tmp_path):
    bad = tmp_path / "cp.yaml"
    bad.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(ConfigError, match="cannot read"):
        load(bad)
    bad.write_text("listen: [")
    with pytest.raises(ConfigError, match="not YAML"):
        load(bad)


def test_token_command_and_missing_config(tmp_path):
    cfg = tmp_path / "cp.yaml"
    cfg.write_text("store: store\n")
    r = edge_agent("control-plane", "--config", cfg, "token", "--name", "ci", "--role", "operator")
    assert r.returncode == 0 and r.stdout.strip().startswith("eacp_"), r.stderr
    r = edge_agent("control-plane", "--config", cfg, "token", "--name", "ci", "--role", "operator")
    assert r.returncode != 0 and "exists already" in r.stderr
    r = edge_agent("control-plane")
    assert r.returncode == 2 and "--config" in r.stderr


def test_a_broker_that_does_not_answer_does_not_stop_the_service(tmp_path):
    import httpx
    from brokers import free_port
    from cp_support import running_service

    dead = f"mqtt://127.0.0.1:{free_port()}"
    with running_service(tmp_path, mqtt={"url": dead}) as (cp, url):
        health = httpx.get(url + "/api/v1/health").json()
        assert health["fleet_loop"]["running"] is False and "retrying" in health["fleet_loop"]["why"]
        r = httpx.get(url + "/api/v1/devices", headers={"Authorization": f"Bearer {cp.admin_token}"})
        assert r.status_code == 200
