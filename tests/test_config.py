"""agent.config: every key validated with its path in the error; defaults; stable device id; the CLI."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml
from clirunner import edge_agent as _cli
from support.files import write_tree as _sysroot

from agent.config import changed_keys, default_device_id, load_config, parse_config
from agent.errors import ConfigError

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def files(tmp_path):
    """Real credential files the config points at."""
    out = {}
    for name in ("ca.pem", "cert.pem", "key.pem", "pw", "token", "fleet.pub"):
        p = tmp_path / name
        p.write_text("secret-token-0123456789\n")
        p.chmod(0o600)
        out[name] = str(p)
    from agent.artifacts.keys import generate

    out["fleet.pub"] = str(generate(tmp_path / "fleet-keys")[1])  # a real public key: its contents are parsed
    return out


def write(tmp_path, data) -> Path:
    p = tmp_path / "agent.yaml"
    p.write_text(data if isinstance(data, str) else yaml.safe_dump(data))
    return p


def full(files) -> dict:
    return {
        "device_id": "pi-1",
        "groups": ["lab", "kitchen"],
        "state_dir": "state",
        "target": "auto",
        "mqtt": {
            "url": "mqtts://broker.example:8884",
            "username": "pi-1",
            "password_file": files["pw"],
            "tls": {"ca": files["ca.pem"], "cert": files["cert.pem"], "key": files["key.pem"]},
            "topic_prefix": "acme/edge",
        },
        "trust": {"public_keys": [files["fleet.pub"]]},
        "serving": {
            "host": "0.0.0.0",
            "port": 9000,
            "token_file": files["token"],
            "probation_s": 30,
            "build_nice": 5,
            "finite_check_every": 4,
        },
        "inbox": "/srv/inbox",
        "telemetry": {"interval_s": 15},
        "control_plane": {"url": "https://cp.example:8470/", "token_file": files["token"], "report": False},
    }


def test_full_config_resolves(tmp_path, files):
    cfg = load_config(write(tmp_path, full(files)))
    assert cfg.device_id == "pi-1" and cfg.device_id_source == "config"
    assert cfg.groups == ("lab", "kitchen")
    assert cfg.state_dir == tmp_path / "state"  # relative to the config file
    assert cfg.mode == "mqtt"
    assert (cfg.mqtt.host, cfg.mqtt.port, cfg.mqtt.topic_prefix) == ("broker.example", 8884, "acme/edge")
    assert cfg.mqtt.tls.ca == Path(files["ca.pem"]) and cfg.mqtt.password() == "secret-token-0123456789"
    assert cfg.serving.token() == "secret-token-0123456789" and cfg.serving.port == 9000
    assert (cfg.serving.probation_s, cfg.serving.build_nice, cfg.serving.finite_check_every) == (30.0, 5, 4)
    assert cfg.inbox == Path("/srv/inbox") and cfg.telemetry.interval_s == 15.0
    cp = cfg.control_plane
    assert (cp.url, cp.token(), cp.report, cp.retry_max_s) == (
        "https://cp.example:8470",
        "secret-token-0123456789",
        False,
        60.0,
    )
    assert cfg.warnings == ()
    with pytest.raises(AttributeError):
        cfg.device_id = "x"  # frozen
    json.dumps(cfg.to_dict())


def test_empty_file_is_local_mode_with_defaults(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    cfg = load_config(write(tmp_path, ""), root=tmp_path)
    assert cfg.mode == "local" and cfg.mqtt is None
    assert cfg.state_dir == Path("/var/lib/edge-agent") and cfg.inbox == Path("/var/lib/edge-agent/inbox")
    assert (cfg.serving.host, cfg.serving.port, cfg.serving.token_file) == ("127.0.0.1", 8080, None)
    assert (cfg.serving.probation_s, cfg.serving.build_nice, cfg.serving.finite_check_every) == (60.0, 10, 16)
    assert (cfg.serving.max_connections, cfg.serving.max_per_peer) == (1024, 128)
    assert (cfg.serving.header_timeout_s, cfg.serving.idle_timeout_s) == (10.0, 60.0)
    assert cfg.target == "auto" and cfg.telemetry.interval_s == 60.0
    assert cfg.device_id == "edge-0123456789ab"


def test_plain_mqtt_defaults(tmp_path):
    cfg = parse_config({"device_id": "d", "mqtt": {"url": "mqtt://10.0.0.2"}})
    assert (cfg.mqtt.port, cfg.mqtt.tls, cfg.mqtt.topic_prefix, cfg.inbox) == (1883, None, "edge", None)
    assert any("trust.public_keys" in w for w in cfg.warnings)
    tls = parse_config({"device_id": "d", "mqtt": {"url": "mqtts://h"}}).mqtt
    assert tls.port == 8883 and tls.tls is not None and tls.tls.ca is None  # system CAs


def test_shipped_template_is_valid(tmp_path):
    (tmp_path / "etc").mkdir()
    (tmp_path / "etc/machine-id").write_text("0123456789abcdef0123456789abcdef\n")
    cfg = load_config(ROOT / "systemd/agent.yaml", root=tmp_path)
    assert cfg.mode == "local" and cfg.serving.port == 8080


# One bad value per key: (mutation on the full config, expected message fragment).
BAD = [
    ("device_id", "pi/1", "device_id: expected 1-64 characters"),
    ("groups", "lab", "groups: expected a list of group names, got 'lab'"),
    ("groups", ["ok", "#"], "groups[1]: expected 1-64 characters"),
    ("state_dir", 5, "state_dir: expected a non-empty string, got 5"),
    ("target", "raspbery-pi-5", "target: unknown target 'raspbery-pi-5'"),
    ("target", True, "target: expected a non-empty string, got a boolean (true)"),
    ("mqtt", "mqtt://x", "mqtt: expected a mapping, got 'mqtt://x'"),
    ("mqtt.url", "htp://x", "mqtt.url: expected mqtt:// or mqtts://, got 'htp://x'"),
    ("mqtt.url", "mqtt://u:p@h", "mqtt.url: credentials in the URL are not allowed"),
    ("mqtt.url", "mqtt://h:99999", "mqtt.url: port must be 1-65535"),
    ("mqtt.username", ["a"], "mqtt.username: expected a non-empty string, got a list"),
    ("mqtt.password_file", "", "mqtt.password_file: expected a non-empty string"),
    ("mqtt.tls", "yes", "mqtt.tls: expected a mapping, got 'yes'"),
    ("mqtt.tls.ca", 1, "mqtt.tls.ca: expected a non-empty string, got 1"),
    ("mqtt.tls.cert", None, "mqtt.tls.cert: a client certificate needs both"),
    ("mqtt.tls.key", None, "mqtt.tls.key: a client certificate needs both"),
    ("mqtt.topic_prefix", "edge/#", "mqtt.topic_prefix: expected '/'-separated names"),
    ("mqtt.colour", "red", "mqtt.colour: unknown key"),
    ("trust", ["k"], "trust: expected a mapping, got a list"),
    ("trust.public_keys", {"a": 1}, "trust.public_keys: expected a list of file paths"),
    ("serving.host", "a b", "serving.host: expected a host name or IP address"),
    ("serving.port", "8080", "serving.port: expected an integer 0-65535, got '8080'"),
    ("serving.port", 70000, "serving.port: expected an integer 0-65535, got 70000"),
    ("serving.token_file", 3, "serving.token_file: expected a non-empty string, got 3"),
    ("serving.probation_s", 0, "serving.probation_s: expected a number"),
    ("serving.build_nice", 20, "serving.build_nice: expected an integer 0-19, got 20"),
    ("serving.finite_check_every", 0, "serving.finite_check_every: expected an integer 1-1000000, got 0"),
    ("serving.max_connections", 0, "serving.max_connections: expected an integer 1-1000000, got 0"),
    ("serving.max_per_peer", "all", "serving.max_per_peer: expected an integer"),
    ("serving.header_timeout_s", 0, "serving.header_timeout_s: expected a number"),
    ("serving.idle_timeout_s", -1, "serving.idle_timeout_s: expected a number"),
    ("inbox", [], "inbox: expected a non-empty string, got a list"),
    ("telemetry", 5, "telemetry: expected a mapping, got 5"),
    ("telemetry.interval_s", -1, "telemetry.interval_s: expected a number of seconds 0-86400, got -1"),
    ("telemetry.interval_s", "1m", "telemetry.interval_s: expected a number of seconds"),
    ("telemtry", {}, "telemtry: unknown key (did you mean 'telemetry'?)"),
    ("control_plane", "http://cp", "control_plane: expected a mapping, got 'http://cp'"),
    ("control_plane.url", None, "control_plane.url: required when a control_plane section is present"),
    ("control_plane.url", "mqtt://cp:1883", "control_plane.url: expected http:// or https://host[:port]"),
    ("control_plane.url", "cp.example:8470", "control_plane.url: expected http:// or https://host[:port]"),
    ("control_plane.url", "https://u:p@cp", "control_plane.url: credentials in the URL are not allowed"),
    ("control_plane.url", "https://cp:0x50", "control_plane.url: port must be 1-65535"),
    ("control_plane.url", "https://cp/?a=1", "control_plane.url: expected no query or fragment"),
    ("control_plane.report", "yes", "control_plane.report: expected true or false, got 'yes'"),
    ("control_plane.retry_max_s", 0, "control_plane.retry_max_s: expected a number"),
    ("control_plane.token", "x", "control_plane.token: unknown key (did you mean 'token_file'?)"),
]


def _set(d: dict, dotted: str, value) -> None:
    *parents, last = dotted.split(".")
    for p in parents:
        d = d[p]
    if value is None:
        del d[last]
    else:
        d[last] = value


@pytest.mark.parametrize("key,value,message", BAD, ids=[f"{k}={v!r}" for k, v, _ in BAD])
def test_each_key_rejects_bad_values(tmp_path, files, monkeypatch, key, value, message):
    monkeypatch.setattr("agent.config.sections.known_targets", lambda: ["raspberry-pi-5", "generic-x86_64"])
    data = full(files)
    _set(data, key, value)
    with pytest.raises(ConfigError) as err:
        load_config(write(tmp_path, data))
    assert message in str(err.value)


@pytest.mark.parametrize(
    "key",
    [
        "mqtt.password_file",
        "mqtt.tls.ca",
        "mqtt.tls.cert",
        "mqtt.tls.key",
        "serving.token_file",
        "control_plane.token_file",
    ],
)
def test_missing_credential_file_named_by_key(tmp_path, files, key):
    data = full(files)
    _set(data, key, str(tmp_path / "nope"))
    with pytest.raises(ConfigError, match=rf"^{key.replace('.', '[.]')}: file not found: .*nope$"):
        load_config(write(tmp_path, data))


def test_missing_public_key_names_index(tmp_path, files):
    data = full(files)
    data["trust"]["public_keys"].append("missing.pub")
    with pytest.raises(ConfigError, match=r"trust\.public_keys\[1\]: file not found: .*missing\.pub"):
        load_config(write(tmp_path, data))


def test_structural_errors(tmp_path, files):
    with pytest.raises(ConfigError, match="config: expected a mapping, got a list"):
        load_config(write(tmp_path, "- a\n- b\n"))
    with pytest.raises(ConfigError, match=r"line 2 column .* invalid YAML"):
        load_config(write(tmp_path, "groups: [a\nmqtt: {\n"))
    with pytest.raises(ConfigError, match="no such config file"):
        load_config(tmp_path / "absent.yaml")
    with pytest.raises(ConfigError, match="mqtt.url: required"):
        parse_config({"device_id": "d", "mqtt": {"username": "x"}})
    with pytest.raises(ConfigError, match="mqtt.tls: set, but mqtt.url is plain"):
        parse_config({"device_id": "d", "mqtt": {"url": "mqtt://h", "tls": {}}})
    with pytest.raises(ConfigError, match="mqtt.password_file: set without mqtt.username"):
        parse_config({"device_id": "d", "mqtt": {"url": "mqtt://h", "password_file": "/x"}})


def test_loose_secret_permissions_warn(tmp_path, files):
    os.chmod(files["token"], 0o644)
    cfg = load_config(write(tmp_path, full(files)))
    assert any("serving.token_file" in w and "world-readable" in w for w in cfg.warnings)


def test_device_id_prefers_board_serial_and_is_stable(tmp_path):
    mid = {"etc/machine-id": b"0123456789abcdef0123456789abcdef\n"}
    dt = _sysroot(tmp_path / "dt", {"proc/device-tree/serial-number": b"1423a0b7c9d8\0", **mid})
    assert default_device_id(dt) == ("edge-1423a0b7c9d8", "/proc/device-tree/serial-number")
    pi = _sysroot(tmp_path / "pi", {"proc/cpuinfo": b"processor\t: 0\nSerial\t\t: 10000000abcdef01\n", **mid})
    assert default_device_id(pi) == ("edge-10000000abcdef01", "/proc/cpuinfo Serial")
    zero = _sysroot(tmp_path / "z", {"proc/cpuinfo": b"Serial\t\t: 0000000000000000\n", **mid})
    assert default_device_id(zero) == ("edge-0123456789ab", "/etc/machine-id")
    assert default_device_id(zero) == default_device_id(zero)  # never random
    assert default_device_id(tmp_path / "empty") is None
    with pytest.raises(ConfigError, match="device_id: not set and no stable id found"):
        parse_config({}, root=tmp_path / "empty")


def test_changed_keys_splits_reloadable(files, tmp_path):
    a = parse_config(full(files), base_dir=tmp_path)
    changed = full(files)
    changed["telemetry"]["interval_s"] = 5
    changed["serving"]["port"] = 9001
    changed["groups"] = ["lab"]
    reload, restart = changed_keys(a, parse_config(changed, base_dir=tmp_path))
    assert reload == {"telemetry.interval_s"} and restart == {"serving.port", "groups"}


def test_cli_config_check(tmp_path, files):
    good = write(tmp_path, full(files))
    r = _cli("config", "check", str(good), "--json")
    assert r.returncode == 0, r.stderr
    doc = json.loads(r.stdout)
    assert doc["ok"] and doc["config"]["mqtt"]["port"] == 8884 and doc["config"]["mode"] == "mqtt"
    r = _cli("config", "check", str(good))
    assert r.returncode == 0 and "ok (mqtt mode)" in r.stdout and "secret" not in r.stdout
    bad = tmp_path / "bad.yaml"
    bad.write_text("device_id: d\nmqtt: {url: 'htp://x'}\n")
    r = _cli("config", "check", str(bad))
    assert r.returncode == 2 and r.stderr.strip() == "error: mqtt.url: expected mqtt:// or mqtts://, got 'htp://x'"
    assert "Traceback" not in r.stderr
    r = _cli("config", "check", str(bad), "--json")
    assert r.returncode == 2 and json.loads(r.stdout)["error"].startswith("mqtt.url:")


def test_model_signing_trust_is_decoded_when_the_config_loads(tmp_path, files):
    """trust.model_signing_keys must be EC public keys and trust.model_signing_certificates certificates, and the
    model-signing library must be there: a ConfigError naming the key at `config check`, start-up and reload,
    not every package refused at VERIFYING."""
    import subprocess
    import sys

    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    pem = (
        ec.generate_private_key(ec.SECP256R1())
        .public_key()
        .public_bytes(serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo)
    )
    (tmp_path / "publisher.pub").write_bytes(pem)
    data = full(files)
    data["trust"]["model_signing_keys"] = [str(tmp_path / "publisher.pub")]
    (tmp_path / "good").mkdir()
    good = write(tmp_path / "good", data)
    assert load_config(good).trust.model_signing_keys == (tmp_path / "publisher.pub",)

    data["trust"]["model_signing_keys"].append(files["fleet.pub"])  # the fleet's Ed25519 key: not what signs models
    with pytest.raises(ConfigError, match=r"trust\.model_signing_keys\[1\]: .*fleet\.pub is a .*Ed25519.*EC keys"):
        load_config(write(tmp_path, data))
    data["trust"]["model_signing_keys"] = [files["pw"]]
    with pytest.raises(ConfigError, match=r"trust\.model_signing_keys\[0\]: .*pw is not a PEM public key"):
        load_config(write(tmp_path, data))
    data["trust"]["model_signing_keys"] = []
    data["trust"]["model_signing_certificates"] = [files["ca.pem"]]
    with pytest.raises(ConfigError, match=r"trust\.model_signing_certificates\[0\]: .*ca\.pem holds no PEM certif"):
        load_config(write(tmp_path, data))

    # a device without the library (its import blocked in a fresh interpreter): the config says so
    code = (
        "import sys; sys.modules['model_signing'] = None\n"
        "from agent.config import load_config\n"
        "from agent.errors import ConfigError\n"
        f"try:\n    load_config({str(good)!r})\nexcept ConfigError as exc:\n    print(exc)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert "model-signing library is not installed; pip install 'edge-agent[signing]'" in out.stdout, out
