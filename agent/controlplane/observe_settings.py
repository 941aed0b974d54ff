"""The `telemetry` and `alerts` sections of the control plane's config (docs/control-plane.md, "Telemetry, charts
and alerts"): how health telemetry is downsampled and kept, when alerts are raised and where they are sent."""

from __future__ import annotations

from dataclasses import dataclass, field, fields
from typing import Any
from urllib.parse import urlsplit

from agent.errors import ConfigError


@dataclass(frozen=True)
class TelemetrySettings:
    bucket_s: int = 60  # one point per device (and per device and model) per bucket: samples in it are merged
    max_points: int = 1440  # points kept per device (and per device and model), the oldest deleted first
    retention_s: int = 86400  # points older than this are deleted, whatever their number


@dataclass(frozen=True)
class WebhookSettings:
    url: str | None = None  # POST JSON here (http or https); None: alerts are only shown
    timeout_s: float = 5.0  # per attempt: connect, send and read
    max_attempts: int = 5  # then the alert's delivery is marked failed (shown on the alerts page)
    backoff_s: float = 1.0  # before the 2nd attempt, doubling per attempt, at most 60 s
    queue: int = 100  # alerts waiting to be sent; the rest stay pending in the database and are offered again
    response_bytes: int = 4096  # read of the answer at most (the body is only kept as a note of a failure)


@dataclass(frozen=True)
class AlertSettings:
    check_s: float = 10.0  # how often conditions are evaluated
    silent_s: float = 600.0  # a device heard from (status or health) no later than this ago has gone silent
    recent_s: float = 86400.0  # a halted rollout alerts while updated within this long (or still live)
    max_devices: int = 500  # device alerts per kind at most (the oldest conditions first)
    webhook: WebhookSettings = field(default_factory=WebhookSettings)


_INT_RANGES = {
    "bucket_s": (1, 86400),
    "max_points": (2, 100_000),
    "retention_s": (60, 365 * 86400),
    "max_attempts": (1, 20),
    "queue": (1, 100_000),
    "response_bytes": (0, 1 << 20),
    "max_devices": (1, 100_000),
}
_FLOAT_RANGES = {
    "check_s": (0.05, 3600.0),
    "silent_s": (1.0, 30 * 86400.0),
    "recent_s": (60.0, 365 * 86400.0),
    "timeout_s": (0.1, 120.0),
    "backoff_s": (0.01, 600.0),
}


def _section(doc: Any, name: str, cls: type, skip: tuple[str, ...] = ()) -> dict[str, Any]:
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise ConfigError(f"{name}: expected a mapping")
    known = [f.name for f in fields(cls)]
    unknown = sorted(set(doc) - set(known))
    if unknown:
        raise ConfigError(f"{name}.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
    out: dict[str, Any] = {}
    for key, value in doc.items():
        if key in skip:
            continue
        if key in _INT_RANGES:
            lo, hi = _INT_RANGES[key]
            if not isinstance(value, int) or isinstance(value, bool) or not lo <= value <= hi:
                raise ConfigError(f"{name}.{key}: expected an integer {lo}-{hi}, got {value!r}")
        elif key in _FLOAT_RANGES:
            lo2, hi2 = _FLOAT_RANGES[key]
            if not isinstance(value, (int, float)) or isinstance(value, bool) or not lo2 <= value <= hi2:
                raise ConfigError(f"{name}.{key}: expected {lo2:g}-{hi2:g} seconds, got {value!r}")
            value = float(value)
        out[key] = value
    return out


def parse_telemetry(doc: Any) -> TelemetrySettings:
    return TelemetrySettings(**_section(doc, "telemetry", TelemetrySettings))


def parse_alerts(doc: Any) -> AlertSettings:
    values = _section(doc, "alerts", AlertSettings, skip=("webhook",))
    hook = (doc or {}).get("webhook") if isinstance(doc, dict) else None
    hook_values = _section(hook, "alerts.webhook", WebhookSettings, skip=("url",))
    if hook is not None and hook.get("url") is not None:
        hook_values["url"] = check_url(hook.get("url"))
    return AlertSettings(**values, webhook=WebhookSettings(**hook_values))


def check_url(url: Any) -> str:
    """An http(s) URL with a host (the operator's; its answers are still read as hostile)."""
    if not isinstance(url, str) or len(url) > 2048:
        raise ConfigError("alerts.webhook.url: expected an http:// or https:// URL")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise ConfigError(f"alerts.webhook.url: expected an http:// or https:// URL with a host, got {url[:80]!r}")
    return url
