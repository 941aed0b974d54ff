"""The control plane's configuration file (YAML), frozen and validated; errors name the key."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from agent.controlplane.limits import Limits, parse_limits
from agent.controlplane.observe_settings import AlertSettings, TelemetrySettings, parse_alerts, parse_telemetry
from agent.errors import ConfigError

KEYS = {
    "listen",
    "database",
    "store",
    "uploads_dir",
    "signing_key",
    "mqtt",
    "admin_token_file",
    "max_body_bytes",
    "tick_s",
    "lease_s",
    "tls",
    "limits",
    "telemetry",
    "alerts",
}


@dataclass(frozen=True)
class Settings:
    host: str = "127.0.0.1"
    port: int = 8470
    database_url: str = ""
    store: Path = Path("store")  # this replica's own files: the default database and admin token sit beside it
    # uploaded packages (the content store devices pull from): one directory every replica reads and writes,
    # a shared filesystem when replicas run on several hosts; default: `store`
    uploads_dir: Path = Path("store")
    signing_key: Path | None = None
    broker_url: str | None = None
    prefix: str = "edge"
    admin_token_file: Path | None = None
    max_body_bytes: int = 256 * 1024 * 1024
    tick_s: float = 0.5
    lease_s: float = 5.0  # the rollout leader's lease: renewed every lease_s / 5, taken over lease_s after
    tls_certfile: Path | None = None  # PEM certificate chain (uvicorn's ssl_certfile)
    tls_keyfile: Path | None = None  # its PEM private key (uvicorn's ssl_keyfile)
    allow_insecure: bool = False  # listen.allow_insecure: plain HTTP beyond loopback (a TLS proxy in front)
    limits: Limits = Limits()  # body caps, JSON depth, rate limits, the pending cap (agent.controlplane.limits)
    telemetry: TelemetrySettings = TelemetrySettings()  # downsampling and retention (observe_settings)
    alerts: AlertSettings = AlertSettings()  # conditions and the webhook (observe_settings)

    @property
    def scheme(self) -> str:
        return "https" if self.tls_certfile is not None else "http"


def _path(base: Path, value: Any, key: str) -> Path:
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{key}: expected a path")
    p = Path(value).expanduser()
    return p if p.is_absolute() else (base / p).resolve()


def parse(doc: Any, base: Path) -> Settings:
    if doc is None:
        doc = {}
    if not isinstance(doc, dict):
        raise ConfigError("control-plane config: expected a mapping at the top")
    unknown = sorted(set(doc) - KEYS)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown key (known: {', '.join(sorted(KEYS))})")
    listen = doc.get("listen") or {}
    if not isinstance(listen, dict):
        raise ConfigError("listen: expected a mapping with host and port")
    port = listen.get("port", 8470)
    if not isinstance(port, int) or not 0 <= port <= 65535:
        raise ConfigError(f"listen.port: expected 0-65535, got {port!r}")
    store = _path(base, doc.get("store", "store"), "store")
    db = doc.get("database") or {}
    if not isinstance(db, dict):
        raise ConfigError("database: expected a mapping with url")
    url = db.get("url") or f"sqlite:///{store.parent / 'control-plane.db'}"
    if not isinstance(url, str) or not url.startswith(("sqlite:///", "postgresql")):
        raise ConfigError("database.url: expected sqlite:///PATH or postgresql://USER@HOST:PORT/DB")
    mqtt = doc.get("mqtt") or {}
    if not isinstance(mqtt, dict):
        raise ConfigError("mqtt: expected a mapping with url and topic_prefix")
    max_body = doc.get("max_body_bytes", Settings.max_body_bytes)
    if not isinstance(max_body, int) or max_body < 1024:
        raise ConfigError(f"max_body_bytes: expected an integer of at least 1024, got {max_body!r}")
    tick = doc.get("tick_s", 0.5)
    if not isinstance(tick, (int, float)) or not 0.01 <= tick <= 10:
        raise ConfigError(f"tick_s: expected 0.01-10 seconds, got {tick!r}")
    lease = doc.get("lease_s", 5.0)
    if not isinstance(lease, (int, float)) or isinstance(lease, bool) or not 1 <= lease <= 60:
        raise ConfigError(f"lease_s: expected 1-60 seconds, got {lease!r}")
    host = str(listen.get("host", "127.0.0.1"))
    certfile, keyfile = _tls(doc.get("tls"), base)
    insecure = _insecure(listen, host, tls=certfile is not None)
    return Settings(
        host=host,
        port=port,
        database_url=url,
        store=store,
        uploads_dir=_path(base, doc["uploads_dir"], "uploads_dir") if doc.get("uploads_dir") else store,
        signing_key=_path(base, doc["signing_key"], "signing_key") if doc.get("signing_key") else None,
        broker_url=mqtt.get("url"),
        prefix=str(mqtt.get("topic_prefix", "edge")),
        admin_token_file=_path(base, doc["admin_token_file"], "admin_token_file")
        if doc.get("admin_token_file")
        else store.parent / "admin.token",
        max_body_bytes=max_body,
        tick_s=float(tick),
        lease_s=float(lease),
        tls_certfile=certfile,
        tls_keyfile=keyfile,
        allow_insecure=insecure,
        limits=parse_limits(doc.get("limits")),
        telemetry=parse_telemetry(doc.get("telemetry")),
        alerts=parse_alerts(doc.get("alerts")),
    )


def _insecure(listen: dict[str, Any], host: str, *, tls: bool) -> bool:
    """listen.allow_insecure: plain HTTP beyond loopback only when asked for by name (a TLS proxy in front)."""
    insecure = listen.get("allow_insecure", False)
    if not isinstance(insecure, bool):
        raise ConfigError(f"listen.allow_insecure: expected true or false, got {insecure!r}")
    if not tls and not insecure and not loopback(host):
        raise ConfigError(
            f"listen.host: {host} is reachable beyond this machine and the service would speak plain HTTP "
            "(operator tokens and session cookies in the clear): give tls.certfile and tls.keyfile, or, with a "
            "TLS-terminating proxy in front, listen.allow_insecure: true"
        )
    return insecure


def loopback(host: str) -> bool:
    import ipaddress

    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def _tls(doc: Any, base: Path) -> tuple[Path | None, Path | None]:
    """tls: {certfile, keyfile} (both or neither; the files are loaded at start: agent.controlplane.service)."""
    if doc is None:
        return None, None
    if not isinstance(doc, dict):
        raise ConfigError("tls: expected a mapping with certfile and keyfile")
    unknown = sorted(set(doc) - {"certfile", "keyfile"})
    if unknown:
        raise ConfigError(f"tls.{unknown[0]}: unknown key (known: certfile, keyfile)")
    if not doc.get("certfile") or not doc.get("keyfile"):
        raise ConfigError("tls: give both certfile and keyfile (PEM files)")
    return _path(base, doc["certfile"], "tls.certfile"), _path(base, doc["keyfile"], "tls.keyfile")


def load(path: str | Path) -> Settings:
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ConfigError(f"{path}: cannot read the control-plane config: {exc}") from None
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML: {exc}") from None
    try:
        return parse(doc, path.parent.resolve())
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
