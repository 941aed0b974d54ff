"""Loading agent.yaml: read the file, validate every section (agent.config.sections), check the credential files
it names, and tell which changed keys a running daemon can reload."""

from __future__ import annotations

import os
import stat
from dataclasses import replace
from pathlib import Path
from typing import Any

from agent.config.schema import DEFAULT_STATE_DIR, RELOADABLE, AgentConfig, TlsConfig
from agent.config.sections import (
    TOP_KEYS,
    read_control_plane,
    read_device_id,
    read_downloads,
    read_groups,
    read_mqtt,
    read_serving,
    read_target,
    read_telemetry,
    read_trust,
)
from agent.config.validator import Validator
from agent.errors import ConfigError
from agent.util import yamlsafe
from agent.util.textfile import read_text


def load_config(
    path: str | os.PathLike[str], *, root: str | os.PathLike[str] = "/", check_files: bool = True
) -> AgentConfig:
    """Read and validate `path`. `root` is where the default device id is looked up (tests use sysroots)."""
    path = Path(path)
    if not path.exists() and not path.is_symlink():
        raise ConfigError(f"{path}: no such config file")
    if path.is_dir():
        raise ConfigError(f"{path}: is a directory, expected a YAML config file")
    data = yamlsafe.loads(read_text(path, "config file", ConfigError), str(path), ConfigError)
    cfg = parse_config({} if data is None else data, base_dir=path.resolve().parent, root=root, source=path)
    return check_config_files(cfg) if check_files else cfg


def parse_config(
    data: Any, *, base_dir: str | os.PathLike[str] = ".", root: str | os.PathLike[str] = "/", source: Path | None = None
) -> AgentConfig:
    """Validate an already-parsed mapping. Relative paths resolve against `base_dir`. No file I/O except the
    default device id (read under `root` only when device_id is not set)."""
    v = Validator(Path(base_dir))
    top = v.mapping(data, "", TOP_KEYS)
    device_id, id_source = read_device_id(v, top, root)
    state_dir = v.path(top.get("state_dir", str(DEFAULT_STATE_DIR)), "state_dir")
    mqtt = read_mqtt(v, top["mqtt"]) if top.get("mqtt") is not None else None
    inbox = v.path(top["inbox"], "inbox") if top.get("inbox") is not None else None
    if mqtt is None and inbox is None:
        inbox = state_dir / "inbox"
    trust = read_trust(v, top.get("trust"))
    serving = read_serving(v, top.get("serving"))
    warnings = []
    if serving.token_file is None and serving.host not in ("127.0.0.1", "::1", "localhost"):
        warnings.append(
            f"serving.host: {serving.host} is not loopback and no serving.token_file is set: "
            "anyone on the network can run inference"
        )
    if mqtt is not None and not trust.public_keys:
        warnings.append("trust.public_keys: empty: every manifest from the broker will be rejected")
    return AgentConfig(
        device_id=device_id,
        device_id_source=id_source,
        groups=read_groups(v, top.get("groups")),
        state_dir=state_dir,
        target=read_target(v, top.get("target", "auto")),
        mqtt=mqtt,
        trust=trust,
        serving=serving,
        inbox=inbox,
        telemetry=read_telemetry(v, top.get("telemetry")),
        downloads=read_downloads(v, top.get("downloads")),
        control_plane=read_control_plane(v, top["control_plane"]) if top.get("control_plane") is not None else None,
        source=source,
        warnings=tuple(warnings),
    )


def check_config_files(cfg: AgentConfig) -> AgentConfig:
    """The I/O half of validation: every referenced credential file exists; warn on loose permissions."""
    files: list[tuple[str, Path | None]] = [("serving.token_file", cfg.serving.token_file)]
    files += [(f"trust.public_keys[{i}]", p) for i, p in enumerate(cfg.trust.public_keys)]
    for name in ("model_signing_keys", "model_signing_certificates"):
        files += [(f"trust.{name}[{i}]", p) for i, p in enumerate(getattr(cfg.trust, name))]
    if cfg.mqtt is not None:
        files.append(("mqtt.password_file", cfg.mqtt.password_file))
        tls = cfg.mqtt.tls or TlsConfig()
        files += [("mqtt.tls.ca", tls.ca), ("mqtt.tls.cert", tls.cert), ("mqtt.tls.key", tls.key)]
    if cfg.control_plane is not None:
        files.append(("control_plane.token_file", cfg.control_plane.token_file))
    warnings = list(cfg.warnings)
    for key, p in files:
        if p is None:
            continue
        try:
            st = p.stat()
        except FileNotFoundError:
            raise ConfigError(f"{key}: file not found: {p}") from None
        except OSError as exc:
            raise ConfigError(f"{key}: cannot access {p}: {exc.strerror}") from None
        if not stat.S_ISREG(st.st_mode):
            raise ConfigError(f"{key}: expected a regular file, got {p}")
        if not os.access(p, os.R_OK):
            raise ConfigError(f"{key}: {p} is not readable by this user (uid {os.getuid()})")
        secret = key in ("mqtt.password_file", "mqtt.tls.key", "serving.token_file", "control_plane.token_file")
        if secret and st.st_mode & stat.S_IROTH:
            warnings.append(f"{key}: {p} is world-readable; chmod 600 (or 640 with group edge-agent)")
    _decode_files(cfg)
    return replace(cfg, warnings=tuple(warnings))


def _decode_files(cfg: AgentConfig) -> None:
    """Decode what the daemon will read from the files (token, password, trusted keys), so that a bad one is a
    ConfigError naming the key and the reason here: at `config check`, at start-up and on reload."""
    cfg.serving.token()
    if cfg.mqtt is not None:
        cfg.mqtt.password()
    if cfg.control_plane is not None:
        cfg.control_plane.token()
    from agent.artifacts.keys import parse_public_key

    for i, p in enumerate(cfg.trust.public_keys):
        key = f"trust.public_keys[{i}]"
        parse_public_key(read_text(p, key, ConfigError, max_bytes=65536), where=f"{key}: {p}")
    _decode_model_signing(cfg)


def _decode_model_signing(cfg: AgentConfig) -> None:
    """trust.model_signing_keys are EC public keys and trust.model_signing_certificates X.509 certificates (PEM),
    and the model-signing library that verifies with them is installed: else every package would be refused
    at VERIFYING, one deployment at a time, for a reason the config already shows."""
    keys, certs = cfg.trust.model_signing_keys, cfg.trust.model_signing_certificates
    if not keys and not certs:
        return
    from cryptography import x509
    from cryptography.exceptions import UnsupportedAlgorithm
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.hazmat.primitives.serialization import load_pem_public_key

    for i, p in enumerate(keys):
        key = f"trust.model_signing_keys[{i}]"
        try:
            pub = load_pem_public_key(read_text(p, key, ConfigError, max_bytes=65536).encode())
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise ConfigError(f"{key}: {p} is not a PEM public key ({exc})") from None
        if not isinstance(pub, ec.EllipticCurvePublicKey):
            raise ConfigError(f"{key}: {p} is a {type(pub).__name__}; model signatures are verified with EC keys")
    for i, p in enumerate(certs):
        key = f"trust.model_signing_certificates[{i}]"
        try:
            x509.load_pem_x509_certificates(read_text(p, key, ConfigError, max_bytes=1 << 20).encode())
        except ValueError as exc:
            raise ConfigError(f"{key}: {p} holds no PEM certificate ({exc})") from None
    import importlib.util

    try:
        found = importlib.util.find_spec("model_signing") is not None
    except (ImportError, ValueError):  # ValueError: a module set to None in sys.modules (import blocked)
        found = False
    if not found:
        raise ConfigError(
            "trust.model_signing_keys / trust.model_signing_certificates: the model-signing library is not "
            "installed; pip install 'edge-agent[signing]'"
        )


def changed_keys(old: AgentConfig, new: AgentConfig) -> tuple[set[str], set[str]]:
    """Key paths that differ, split into (reloadable on SIGHUP, needing a restart)."""
    a, b = _flatten(old.to_dict()), _flatten(new.to_dict())
    diff = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} - {"source", "warnings"}
    return {k for k in diff if k in RELOADABLE}, {k for k in diff if k not in RELOADABLE}


def _flatten(d: dict[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, val in d.items():
        if isinstance(val, dict):
            out |= _flatten(val, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = val
    return out
