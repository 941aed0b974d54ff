"""The agent configuration (agent.yaml): frozen dataclasses, validated once, errors naming the key path.

`schema` holds the dataclasses and their defaults, `validator` the typed getters, `sections` one reader per
section, `load` the file, its credential files and the reload diff. Import from here."""

from __future__ import annotations

from agent.config.load import changed_keys, check_config_files, load_config, parse_config
from agent.config.schema import (
    DEFAULT_PATH,
    DEFAULT_STATE_DIR,
    MIN_TOKEN_CHARS,
    MQTT_PORTS,
    RELOADABLE,
    AgentConfig,
    ControlPlaneConfig,
    DownloadsConfig,
    MqttConfig,
    ServingConfig,
    TelemetryConfig,
    TlsConfig,
    TrustConfig,
    first_line,
)
from agent.config.sections import known_targets
from agent.device_id import default_device_id

__all__ = [
    "DEFAULT_PATH",
    "DEFAULT_STATE_DIR",
    "MIN_TOKEN_CHARS",
    "MQTT_PORTS",
    "RELOADABLE",
    "AgentConfig",
    "ControlPlaneConfig",
    "DownloadsConfig",
    "MqttConfig",
    "ServingConfig",
    "TelemetryConfig",
    "TlsConfig",
    "TrustConfig",
    "changed_keys",
    "check_config_files",
    "default_device_id",
    "first_line",
    "known_targets",
    "load_config",
    "parse_config",
]
