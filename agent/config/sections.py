"""The readers of agent.yaml's sections (device id, groups, target, mqtt, trust, serving with probation and
shadow, telemetry, downloads): each validates one section and returns its frozen dataclass."""

from __future__ import annotations

import difflib
import os
from collections.abc import Callable
from dataclasses import replace
from typing import Any
from urllib.parse import SplitResult, urlsplit

from agent.config.generative import read_generative
from agent.config.schema import (
    MQTT_PORTS,
    ControlPlaneConfig,
    DownloadsConfig,
    MqttConfig,
    ServingConfig,
    TelemetryConfig,
    TlsConfig,
    TrustConfig,
)
from agent.config.validator import Validator, flag, quantiles, real, show
from agent.device_id import default_device_id
from agent.errors import ConfigError
from agent.names import is_valid_name
from agent.trial.settings import ProbationConfig, ShadowConfig

TOP_KEYS = (
    "device_id",
    "groups",
    "state_dir",
    "target",
    "mqtt",
    "trust",
    "serving",
    "inbox",
    "telemetry",
    "downloads",
    "control_plane",
)


def read_downloads(v: Validator, raw: Any) -> DownloadsConfig:
    d = v.mapping(raw if raw is not None else {}, "downloads", ("allow_http", "min_bytes", "interval_s", "timeout_s"))
    return DownloadsConfig(
        allow_http=flag(d.get("allow_http", False), "downloads.allow_http"),
        min_bytes=v.integer(d.get("min_bytes", 64 * 1024), "downloads.min_bytes", 1, 1 << 40),
        interval_s=v.number(d.get("interval_s", 30.0), "downloads.interval_s", 0.5, 86400),
        timeout_s=v.number(d.get("timeout_s", 6 * 3600.0), "downloads.timeout_s", 1, 30 * 86400),
    )


def read_control_plane(v: Validator, raw: Any) -> ControlPlaneConfig:
    c = v.mapping(raw, "control_plane", ("url", "token_file", "report", "retry_max_s"))
    if c.get("url") is None:
        raise ConfigError(
            "control_plane.url: required when a control_plane section is present (e.g. http://cp:8470); "
            "remove the section to run without a control plane"
        )
    url = v.string(c["url"], "control_plane.url")
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.netloc:
        raise ConfigError(f"control_plane.url: expected http:// or https://host[:port], got {url!r}")
    if parts.username or parts.password:
        raise ConfigError("control_plane.url: credentials in the URL are not allowed (the device signs its requests)")
    if parts.query or parts.fragment:
        raise ConfigError(f"control_plane.url: expected no query or fragment, got {url!r}")
    _port_and_host(parts, "control_plane.url", url)
    token = v.path(c["token_file"], "control_plane.token_file") if c.get("token_file") is not None else None
    return ControlPlaneConfig(
        url=url.rstrip("/"),
        token_file=token,
        report=flag(c.get("report", True), "control_plane.report"),
        retry_max_s=v.number(c.get("retry_max_s", 60.0), "control_plane.retry_max_s", 1, 86400),
    )


def read_device_id(v: Validator, top: dict[str, Any], root: str | os.PathLike[str]) -> tuple[str, str]:
    if top.get("device_id") is not None:
        return v.name(top["device_id"], "device_id"), "config"
    found = default_device_id(root)
    if found is None:
        raise ConfigError(
            "device_id: not set and no stable id found (/proc/device-tree/serial-number, "
            "/proc/cpuinfo Serial, /etc/machine-id); set device_id in the config"
        )
    return found


def read_mqtt(v: Validator, raw: Any) -> MqttConfig:
    m = v.mapping(raw, "mqtt", ("url", "username", "password_file", "tls", "topic_prefix"))
    if m.get("url") is None:
        raise ConfigError(
            "mqtt.url: required when an mqtt section is present (e.g. mqtt://broker:1883); "
            "remove the mqtt section for local inbox mode"
        )
    raw_urls = m["url"] if isinstance(m["url"], list) else [m["url"]]
    if not raw_urls:
        raise ConfigError("mqtt.url: an empty list; give one broker URL or the URLs of a cluster's nodes")
    urls = [_mqtt_url(v, u) for u in raw_urls]  # a list: the nodes of a cluster, tried in turn (failover)
    if len({urlsplit(u).scheme for u in urls}) > 1:
        raise ConfigError(f"mqtt.url: the list mixes mqtt:// and mqtts://: {urls}")
    parts = urlsplit(urls[0])
    port = parts.port or MQTT_PORTS[parts.scheme]
    tls = _tls(v, m.get("tls"), parts.scheme)
    user = v.string(m["username"], "mqtt.username") if m.get("username") is not None else None
    pw = v.path(m["password_file"], "mqtt.password_file") if m.get("password_file") is not None else None
    if pw is not None and user is None:
        raise ConfigError("mqtt.password_file: set without mqtt.username")
    prefix = v.string(m.get("topic_prefix", "edge"), "mqtt.topic_prefix")
    if not all(is_valid_name(seg) for seg in prefix.split("/")):
        raise ConfigError(
            f"mqtt.topic_prefix: expected '/'-separated names of [A-Za-z0-9._-] (no wildcards, "
            f"no empty levels), got {prefix!r}"
        )
    assert parts.hostname  # _mqtt_url checked it
    return MqttConfig(
        url=",".join(urls),  # BrokerConfig splits it again: connect to the first, fail over to the next
        host=parts.hostname,
        port=port,
        tls=tls,
        username=user,
        password_file=pw,
        topic_prefix=prefix,
    )


def _mqtt_url(v: Validator, raw: Any) -> str:
    """One mqtt.url entry: mqtt[s]://host[:port], no credentials, nothing after the port."""
    url = v.string(raw, "mqtt.url")
    if "," in url:
        raise ConfigError(f"mqtt.url: {url!r} holds a comma; give a cluster's nodes as a list of URLs")
    parts = urlsplit(url)
    if parts.scheme not in MQTT_PORTS or not parts.netloc:
        raise ConfigError(f"mqtt.url: expected mqtt:// or mqtts://, got {url!r}")
    if parts.username or parts.password:
        raise ConfigError("mqtt.url: credentials in the URL are not allowed; use mqtt.username and mqtt.password_file")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"mqtt.url: expected mqtt[s]://host[:port] with nothing after the port, got {url!r}")
    _port_and_host(parts, "mqtt.url", url)
    return url


def _tls(v: Validator, raw: Any, scheme: str) -> TlsConfig | None:
    if raw is not None and scheme != "mqtts":
        raise ConfigError("mqtt.tls: set, but mqtt.url is plain mqtt://; use mqtts:// for TLS")
    if scheme != "mqtts":
        return None
    t = v.mapping(raw if raw is not None else {}, "mqtt.tls", ("ca", "cert", "key"))
    tls = TlsConfig(
        **{k: v.path(t[k], f"mqtt.tls.{k}") if t.get(k) is not None else None for k in ("ca", "cert", "key")}
    )
    if (tls.cert is None) != (tls.key is None):
        missing = "key" if tls.key is None else "cert"
        raise ConfigError(f"mqtt.tls.{missing}: a client certificate needs both mqtt.tls.cert and mqtt.tls.key")
    return tls


def read_trust(v: Validator, raw: Any) -> TrustConfig:
    names: tuple[str, ...] = ("public_keys", "max_skew_s", "model_signing_keys", "model_signing_certificates")
    names += ("model_signing_ignore_paths",)
    t = v.mapping(raw if raw is not None else {}, "trust", names)
    paths = {}
    for name in ("public_keys", "model_signing_keys", "model_signing_certificates"):
        keys = t.get(name) or []
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, list):
            raise ConfigError(f"trust.{name}: expected a list of file paths, got {show(keys)}")
        paths[name] = tuple(v.path(k, f"trust.{name}[{i}]") for i, k in enumerate(keys))
    skew = v.number(t["max_skew_s"], "trust.max_skew_s", 0, 7 * 86400) if "max_skew_s" in t else 300.0
    ignore = _ignore_paths(t.get("model_signing_ignore_paths"))
    return TrustConfig(
        paths["public_keys"], skew, paths["model_signing_keys"], paths["model_signing_certificates"], ignore
    )


def _ignore_paths(raw: Any) -> tuple[str, ...]:
    """trust.model_signing_ignore_paths: package-relative files or folders, none of them the whole package."""
    items = [raw] if isinstance(raw, str) else (raw or [])
    if not isinstance(items, list):
        raise ConfigError(f"trust.model_signing_ignore_paths: expected a list of package paths, got {show(raw)}")
    out = []
    for i, item in enumerate(items):
        parts = str(item).strip("/").split("/") if isinstance(item, str) else []
        if not parts or any(p in ("", ".", "..") for p in parts) or item.startswith("/") or item == "model.sig":
            raise ConfigError(
                f"trust.model_signing_ignore_paths[{i}]: expected a relative path inside a package "
                f"(no '..', not model.sig), got {show(item)}"
            )
        out.append("/".join(parts))
    return tuple(out)


def read_serving(v: Validator, raw: Any) -> ServingConfig:
    s = v.mapping(
        raw if raw is not None else {},
        "serving",
        (
            "host",
            "port",
            "grpc_port",
            "token_file",
            "probation_s",
            "build_nice",
            "finite_check_every",
            "max_connections",
            "max_per_peer",
            "header_timeout_s",
            "idle_timeout_s",
            "shm_in_place",
            "memory_max",
            "probation",
            "shadow",
            "generative",
        ),
    )
    host = v.string(s.get("host", "127.0.0.1"), "serving.host")
    if any(c.isspace() for c in host) or "/" in host:
        raise ConfigError(f"serving.host: expected a host name or IP address, got {host!r}")
    port = v.integer(s.get("port", 8080), "serving.port", 0, 65535)
    token = v.path(s["token_file"], "serving.token_file") if s.get("token_file") is not None else None
    grpc_raw = s.get("grpc_port", 0 if port == 0 else 8001)  # tests on free ports get a free gRPC port too
    grpc_port = None if grpc_raw is None or grpc_raw is False else v.integer(grpc_raw, "serving.grpc_port", 0, 65535)
    return ServingConfig(
        host=host,
        port=port,
        grpc_port=grpc_port,
        token_file=token,
        probation_s=v.number(s.get("probation_s", 60.0), "serving.probation_s", 0.1, 7 * 86400),
        build_nice=v.integer(s.get("build_nice", 10), "serving.build_nice", 0, 19),
        finite_check_every=v.integer(s.get("finite_check_every", 16), "serving.finite_check_every", 1, 1_000_000),
        memory_max=_memory_max(s.get("memory_max")),
        max_connections=v.integer(s.get("max_connections", 1024), "serving.max_connections", 1, 1_000_000),
        max_per_peer=v.integer(s.get("max_per_peer", 128), "serving.max_per_peer", 1, 1_000_000),
        header_timeout_s=v.number(s.get("header_timeout_s", 10.0), "serving.header_timeout_s", 0.1, 3600),
        idle_timeout_s=v.number(s.get("idle_timeout_s", 60.0), "serving.idle_timeout_s", 0.1, 86400),
        shm_in_place=_flag(s.get("shm_in_place", False), "serving.shm_in_place"),
        probation=_probation(v, s.get("probation")),
        shadow=_shadow(v, s.get("shadow")),
        generative=read_generative(v, s.get("generative")),
    )


def _flag(raw: Any, key: str) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(f"{key}: expected true or false, got {show(raw)}")
    return raw


def _probation(v: Validator, raw: Any) -> ProbationConfig:
    d, key = ProbationConfig(), "serving.probation"
    p = v.mapping(raw if raw is not None else {}, key, tuple(ProbationConfig.__dataclass_fields__))
    g: Callable[[str], Any] = lambda name: p.get(name, getattr(d, name))  # noqa: E731
    return ProbationConfig(
        max_errors=v.integer(g("max_errors"), f"{key}.max_errors", 0, 1_000_000),
        max_nonfinite=v.integer(g("max_nonfinite"), f"{key}.max_nonfinite", 0, 1_000_000),
        ratio=real(g("ratio"), f"{key}.ratio", 1.0, 100.0),
        slack_ms=real(g("slack_ms"), f"{key}.slack_ms", 0.0, 60_000.0),
        quantiles=quantiles(g("quantiles"), f"{key}.quantiles"),
        alpha=real(g("alpha"), f"{key}.alpha", 1e-12, 0.5),
        p90_samples=v.integer(g("p90_samples"), f"{key}.p90_samples", 8, 4096),
        p99_samples=v.integer(g("p99_samples"), f"{key}.p99_samples", 100, 4096),
        rate_tolerance=real(g("rate_tolerance"), f"{key}.rate_tolerance", 1.0, 1000.0),
        baseline_s=v.number(g("baseline_s"), f"{key}.baseline_s", 1.0, 86400.0),
        qualified_factor=real(g("qualified_factor"), f"{key}.qualified_factor", 1.0, 1000.0),
        qualified_quantiles=quantiles(g("qualified_quantiles"), f"{key}.qualified_quantiles"),
        min_requests=v.integer(g("min_requests"), f"{key}.min_requests", 0, 100_000_000),
        extend=real(g("extend"), f"{key}.extend", 1.0, 100.0),
        referee=flag(g("referee"), f"{key}.referee"),
        paired=flag(g("paired"), f"{key}.paired"),
        paired_share=real(g("paired_share"), f"{key}.paired_share", 0.001, 1.0),
        paired_aa_share=real(g("paired_aa_share"), f"{key}.paired_aa_share", 0.0, 0.9),
        paired_min_pairs=v.integer(g("paired_min_pairs"), f"{key}.paired_min_pairs", 8, 100_000),
        paired_min_aa=v.integer(g("paired_min_aa"), f"{key}.paired_min_aa", 8, 100_000),
        paired_confidence=real(g("paired_confidence"), f"{key}.paired_confidence", 0.5, 0.9999),
        paired_twin=flag(g("paired_twin"), f"{key}.paired_twin"),
    )


def _shadow(v: Validator, raw: Any) -> ShadowConfig:
    d, key = ShadowConfig(), "serving.shadow"
    if isinstance(raw, bool):  # `shadow: false` switches it off
        return replace(d, enabled=raw)
    p = v.mapping(raw if raw is not None else {}, key, tuple(ShadowConfig.__dataclass_fields__))
    g: Callable[[str], Any] = lambda name: p.get(name, getattr(d, name))  # noqa: E731
    max_rel = g("max_rel")
    return ShadowConfig(
        enabled=flag(g("enabled"), f"{key}.enabled"),
        requests=v.integer(g("requests"), f"{key}.requests", 1, 1_000_000),
        duration_s=v.number(g("duration_s"), f"{key}.duration_s", 0.1, 86400.0),
        min_requests=v.integer(g("min_requests"), f"{key}.min_requests", 1, 1_000_000),
        cpu_share=real(g("cpu_share"), f"{key}.cpu_share", 0.001, 1.0),
        min_agreement=real(g("min_agreement"), f"{key}.min_agreement", 0.0, 1.0),
        max_rel=None if max_rel is None else real(max_rel, f"{key}.max_rel", 0.0, 1e9),
        max_failures=v.integer(g("max_failures"), f"{key}.max_failures", 0, 1_000_000),
        max_latency_ratio=real(g("max_latency_ratio"), f"{key}.max_latency_ratio", 1.0, 1000.0),
        slack_ms=real(g("slack_ms"), f"{key}.slack_ms", 0.0, 60_000.0),
    )


def _memory_max(raw: Any) -> int | None:
    from agent.util.sizes import parse_size

    if raw is None:
        return None
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise ConfigError(f"serving.memory_max: {exc}") from None


def read_telemetry(v: Validator, raw: Any) -> TelemetryConfig:
    t = v.mapping(raw if raw is not None else {}, "telemetry", ("interval_s",))
    return TelemetryConfig(interval_s=v.number(t.get("interval_s", 60.0), "telemetry.interval_s", 0, 86400))


def read_groups(v: Validator, raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"groups: expected a list of group names, got {show(raw)}")
    return tuple(dict.fromkeys(v.name(g, f"groups[{i}]") for i, g in enumerate(raw)))


def read_target(v: Validator, raw: Any) -> str:
    name = v.string(raw, "target")
    if name == "auto":
        return name
    known = known_targets()
    if known and name not in known:
        close = difflib.get_close_matches(name, known, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise ConfigError(
            f"target: unknown target {name!r}{hint}; expected 'auto' or one of: {', '.join(sorted(known))}"
        )
    return name


def known_targets() -> list[str]:
    """Target names from targets/*.yaml."""
    from agent.targets import load_targets

    return sorted(load_targets())


def _port_and_host(parts: SplitResult, key: str, url: str) -> None:
    """A URL's port within 1-65535 (urlsplit checks the range only when asked) and a host present."""
    try:
        parts.port  # noqa: B018 - the property raises ValueError out of range
    except ValueError:
        raise ConfigError(f"{key}: port must be 1-65535, got {url!r}") from None
    if not parts.hostname:
        raise ConfigError(f"{key}: missing host in {url!r}")
