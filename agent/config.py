"""The agent configuration (agent.yaml): frozen dataclasses, validated once, errors naming the key path."""

from __future__ import annotations

import difflib
import os
import stat
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from agent.errors import ConfigError
from agent.names import is_valid_name
from agent.util import yamlsafe
from agent.util.textfile import read_text

DEFAULT_PATH = Path("/etc/edge-agent/agent.yaml")
DEFAULT_STATE_DIR = Path("/var/lib/edge-agent")
MQTT_PORTS = {"mqtt": 1883, "mqtts": 8883}
# Keys a running daemon applies on SIGHUP (agent.app.DeviceAgent.reload); any other change needs a restart.
RELOADABLE = frozenset({"trust.public_keys", "serving.token_file", "telemetry.interval_s"})


MIN_TOKEN_CHARS = 16  # a bearer token shorter than this is refused (config check, start-up, reload)


def first_line(path: Path, key: str) -> str:
    """The one rule for secret files (passwords, tokens): the first line, stripped ("" for an empty file).
    ConfigError naming `key` and the file when it cannot be read or is not UTF-8 text."""
    lines = read_text(path, key, ConfigError, max_bytes=65536).splitlines()
    return lines[0].strip() if lines else ""


@dataclass(frozen=True)
class TlsConfig:
    ca: Path | None = None
    cert: Path | None = None
    key: Path | None = None


@dataclass(frozen=True)
class MqttConfig:
    url: str
    host: str
    port: int
    tls: TlsConfig | None  # set (possibly all-None = system CAs) for mqtts://, None for mqtt://
    username: str | None = None
    password_file: Path | None = None
    topic_prefix: str = "edge"

    def password(self) -> str | None:
        """Read the password file (first line, stripped); None when no file is configured."""
        if self.password_file is None:
            return None
        return first_line(self.password_file, "mqtt.password_file")


@dataclass(frozen=True)
class TrustConfig:
    public_keys: tuple[Path, ...] = ()
    max_skew_s: float = 300.0  # an issue time further ahead of the device clock is refused as future-dated
    # OpenSSF model signing (agent.artifacts.modelsig): when any is set, a package must carry model.sig
    model_signing_keys: tuple[Path, ...] = ()
    model_signing_certificates: tuple[Path, ...] = ()


@dataclass(frozen=True)
class ProbationConfig:
    """serving.probation: how a fresh version is judged after its swap (docs/serving.md, Probation)."""

    max_errors: int = 0  # runtime failures blamed on the version, tolerated in the window
    max_nonfinite: int = 0  # NaN/Inf outputs blamed on the version, tolerated in the window
    ratio: float = 1.5  # a compute-time quantile may reach ratio x the incumbent's ...
    slack_ms: float = 0.5  # ... plus this (scheduler noise dominates sub-ms models)
    quantiles: tuple[int, ...] = (50, 90)  # judged against the incumbent (99 needs p99_samples per side)
    alpha: float = 0.01  # one-sided binomial test: "slower" only when p < alpha
    p90_samples: int = 64  # samples per side before a quantile below 99 is judged (field notes: 64 for a p90)
    p99_samples: int = 662  # ... and before a p99 is (field notes: 662)
    rate_tolerance: float = 4.0  # request rates within this factor of each other are comparable
    baseline_s: float = 60.0  # the incumbent's compute times in this window before the swap are the baseline
    qualified_factor: float = 3.0  # no incumbent: qualified quantile x this + slack_ms
    qualified_quantiles: tuple[int, ...] = (50,)  # no incumbent: judged on these only (tails inflate under load)
    min_requests: int = 0  # requests needed to pass; 0: a quiet window passes
    # too few runs measured for a compute verdict when the window ends (the runs' threads waited for the cores,
    # rungate.py): watch on until there are, up to this many times the window; 1: never
    extend: float = 3.0
    referee: bool = True  # make-before-break: keep the incumbent's session until the verdict, to re-run inputs


@dataclass(frozen=True)
class ShadowConfig:
    """serving.shadow: before the swap the candidate answers copies of live requests (docs/serving.md, Shadow)."""

    enabled: bool = True  # skipped anyway where the swap is stop-then-start or no incumbent serves
    requests: int = 200  # the phase ends after this many compared requests ...
    duration_s: float = 30.0  # ... or after this long
    min_requests: int = 20  # fewer compared requests: verdict inconclusive (the deployment goes on)
    cpu_share: float = 0.05  # of one core: the shadow runs at most this fraction of the time
    min_agreement: float = 0.9  # top-1 agreement of classifier outputs below this: fail
    max_rel: float | None = None  # max_rel of other float outputs above this: fail (None: reported only)
    max_failures: int = 0  # candidate failures or NaN/Inf where the incumbent answered finite values
    max_latency_ratio: float = 3.0  # candidate / incumbent compute time (medians) above this ...
    slack_ms: float = 0.5  # ... and above max_latency_ratio x the incumbent's + this: fail (as probation's)


@dataclass(frozen=True)
class ServingConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    grpc_port: int | None = 8001  # KServe v2 gRPC; None: off; 0 (or port 0 with grpc_port unset): a free port
    token_file: Path | None = None
    probation_s: float = 60.0  # watch window after a swap (errors, NaN/Inf, latency) before committing
    build_nice: int = 10  # a new version is built and warmed this many nice levels below serving (0: same)
    finite_check_every: int = 16  # after a version's first 1000 responses and outside probation: check 1 in N
    memory_max: int | None = None  # bytes one model may use; None: the target's memory limit, else 80% MemTotal
    max_connections: int = 1024  # open client connections (idle ones are closed first when it is reached)
    max_per_peer: int = 128  # open connections per client IP address
    header_timeout_s: float = 10.0  # a request head must arrive within this of its first byte
    idle_timeout_s: float = 60.0  # idle keep-alive connections close after this
    probation: ProbationConfig = ProbationConfig()
    shadow: ShadowConfig = ShadowConfig()

    def token(self) -> str | None:
        """Read the bearer token (first line, stripped); None when serving is open (no token_file)."""
        if self.token_file is None:
            return None
        token = first_line(self.token_file, "serving.token_file")
        if not token:
            raise ConfigError(f"serving.token_file: {self.token_file} is empty")
        if len(token) < MIN_TOKEN_CHARS:
            raise ConfigError(
                f"serving.token_file: the token in {self.token_file} has {len(token)} characters, at least "
                f"{MIN_TOKEN_CHARS} are required (e.g. `openssl rand -hex 32 > {self.token_file}`)"
            )
        return token


@dataclass(frozen=True)
class DownloadsConfig:
    allow_http: bool = False  # plain http:// sources in manifests (integrity is the chunk hashes'; not availability)
    min_bytes: int = 64 * 1024  # a source must deliver at least this many bytes ...
    interval_s: float = 30.0  # ... every interval, or it is abandoned for the manifest's next source
    timeout_s: float = 6 * 3600.0  # one download attempt, every source together


@dataclass(frozen=True)
class TelemetryConfig:
    interval_s: float = 60.0  # 0 disables the periodic health message


@dataclass(frozen=True)
class AgentConfig:
    device_id: str
    device_id_source: str  # "config", "/etc/machine-id", "/proc/device-tree/serial-number", ...
    groups: tuple[str, ...]
    state_dir: Path
    target: str  # "auto" or a target name
    mqtt: MqttConfig | None  # None: local mode (packages arrive in `inbox`)
    trust: TrustConfig
    serving: ServingConfig
    inbox: Path | None
    telemetry: TelemetryConfig
    source: Path | None = None  # the file this came from
    warnings: tuple[str, ...] = ()
    downloads: DownloadsConfig = DownloadsConfig()

    @property
    def mode(self) -> str:
        return "local" if self.mqtt is None else "mqtt"

    @property
    def cache_dir(self) -> Path:
        return self.state_dir / "cache"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly resolved view (paths as strings; secrets are never read here)."""
        return _jsonable(asdict(self)) | {"mode": self.mode}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj


from agent.device_id import default_device_id  # noqa: E402,F401 - part of this module's API

# ---------------------------------------------------------------- loading


def load_config(path: str | os.PathLike, *, root: str | os.PathLike = "/", check_files: bool = True) -> AgentConfig:
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
    data: Any, *, base_dir: str | os.PathLike = ".", root: str | os.PathLike = "/", source: Path | None = None
) -> AgentConfig:
    """Validate an already-parsed mapping. Relative paths resolve against `base_dir`. No file I/O except the
    default device id (read under `root` only when device_id is not set)."""
    v = _Validator(Path(base_dir))
    top = v.mapping(data, "", _TOP_KEYS)
    device_id, id_source = _device_id(v, top, root)
    state_dir = v.path(top.get("state_dir", str(DEFAULT_STATE_DIR)), "state_dir")
    mqtt = _mqtt(v, top["mqtt"]) if top.get("mqtt") is not None else None
    inbox = v.path(top["inbox"], "inbox") if top.get("inbox") is not None else None
    if mqtt is None and inbox is None:
        inbox = state_dir / "inbox"
    trust = _trust(v, top.get("trust"))
    serving = _serving(v, top.get("serving"))
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
        groups=_groups(v, top.get("groups")),
        state_dir=state_dir,
        target=_target(v, top.get("target", "auto")),
        mqtt=mqtt,
        trust=trust,
        serving=serving,
        inbox=inbox,
        telemetry=_telemetry(v, top.get("telemetry")),
        downloads=_downloads(v, top.get("downloads")),
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
        secret = key in ("mqtt.password_file", "mqtt.tls.key", "serving.token_file")
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
    from agent.artifacts.keys import parse_public_key

    for i, p in enumerate(cfg.trust.public_keys):
        key = f"trust.public_keys[{i}]"
        parse_public_key(read_text(p, key, ConfigError, max_bytes=65536), where=f"{key}: {p}")


def changed_keys(old: AgentConfig, new: AgentConfig) -> tuple[set[str], set[str]]:
    """Key paths that differ, split into (reloadable on SIGHUP, needing a restart)."""
    a, b = _flatten(old.to_dict()), _flatten(new.to_dict())
    diff = {k for k in a.keys() | b.keys() if a.get(k) != b.get(k)} - {"source", "warnings"}
    return {k for k in diff if k in RELOADABLE}, {k for k in diff if k not in RELOADABLE}


def _flatten(d: dict, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, val in d.items():
        if isinstance(val, dict):
            out |= _flatten(val, f"{prefix}{k}.")
        else:
            out[f"{prefix}{k}"] = val
    return out


# ---------------------------------------------------------------- sections

_TOP_KEYS = (
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
)


def _downloads(v: "_Validator", raw: Any) -> DownloadsConfig:
    d = v.mapping(raw if raw is not None else {}, "downloads", ("allow_http", "min_bytes", "interval_s", "timeout_s"))
    return DownloadsConfig(
        allow_http=_flag(d.get("allow_http", False), "downloads.allow_http"),
        min_bytes=v.integer(d.get("min_bytes", 64 * 1024), "downloads.min_bytes", 1, 1 << 40),
        interval_s=v.number(d.get("interval_s", 30.0), "downloads.interval_s", 0.5, 86400),
        timeout_s=v.number(d.get("timeout_s", 6 * 3600.0), "downloads.timeout_s", 1, 30 * 86400),
    )


def _device_id(v: "_Validator", top: dict, root) -> tuple[str, str]:
    if top.get("device_id") is not None:
        return v.name(top["device_id"], "device_id"), "config"
    found = default_device_id(root)
    if found is None:
        raise ConfigError(
            "device_id: not set and no stable id found (/proc/device-tree/serial-number, "
            "/proc/cpuinfo Serial, /etc/machine-id); set device_id in the config"
        )
    return found


def _mqtt(v: "_Validator", raw: Any) -> MqttConfig:
    m = v.mapping(raw, "mqtt", ("url", "username", "password_file", "tls", "topic_prefix"))
    if m.get("url") is None:
        raise ConfigError(
            "mqtt.url: required when an mqtt section is present (e.g. mqtt://broker:1883); "
            "remove the mqtt section for local inbox mode"
        )
    url = v.string(m["url"], "mqtt.url")
    parts = urlsplit(url)
    if parts.scheme not in MQTT_PORTS or not parts.netloc:
        raise ConfigError(f"mqtt.url: expected mqtt:// or mqtts://, got {url!r}")
    if parts.username or parts.password:
        raise ConfigError("mqtt.url: credentials in the URL are not allowed; use mqtt.username and mqtt.password_file")
    if parts.path not in ("", "/") or parts.query or parts.fragment:
        raise ConfigError(f"mqtt.url: expected mqtt[s]://host[:port] with nothing after the port, got {url!r}")
    try:
        port = parts.port or MQTT_PORTS[parts.scheme]
    except ValueError:
        raise ConfigError(f"mqtt.url: port must be 1-65535, got {url!r}") from None
    if not parts.hostname:
        raise ConfigError(f"mqtt.url: missing host in {url!r}")
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
    return MqttConfig(
        url=url, host=parts.hostname, port=port, tls=tls, username=user, password_file=pw, topic_prefix=prefix
    )


def _tls(v: "_Validator", raw: Any, scheme: str) -> TlsConfig | None:
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


def _trust(v: "_Validator", raw: Any) -> TrustConfig:
    names = ("public_keys", "max_skew_s", "model_signing_keys", "model_signing_certificates")
    t = v.mapping(raw if raw is not None else {}, "trust", names)
    paths = {}
    for name in ("public_keys", "model_signing_keys", "model_signing_certificates"):
        keys = t.get(name) or []
        if isinstance(keys, str):
            keys = [keys]
        if not isinstance(keys, list):
            raise ConfigError(f"trust.{name}: expected a list of file paths, got {_show(keys)}")
        paths[name] = tuple(v.path(k, f"trust.{name}[{i}]") for i, k in enumerate(keys))
    skew = v.number(t["max_skew_s"], "trust.max_skew_s", 0, 7 * 86400) if "max_skew_s" in t else 300.0
    return TrustConfig(paths["public_keys"], skew, paths["model_signing_keys"], paths["model_signing_certificates"])


def _serving(v: "_Validator", raw: Any) -> ServingConfig:
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
            "memory_max",
            "probation",
            "shadow",
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
        probation=_probation(v, s.get("probation")),
        shadow=_shadow(v, s.get("shadow")),
    )


def _real(raw: Any, key: str, lo: float, hi: float) -> float:
    if isinstance(raw, bool) or not isinstance(raw, (int, float)) or raw != raw or not lo <= raw <= hi:
        raise ConfigError(f"{key}: expected a number {lo:g}-{hi:g}, got {_show(raw)}")
    return float(raw)


def _flag(raw: Any, key: str) -> bool:
    if not isinstance(raw, bool):
        raise ConfigError(f"{key}: expected true or false, got {_show(raw)}")
    return raw


def _quantiles(raw: Any, key: str) -> tuple[int, ...]:
    if not isinstance(raw, (list, tuple)) or not raw or any(type(q) is not int or q not in (50, 90, 99) for q in raw):
        raise ConfigError(f"{key}: expected a non-empty list of 50, 90 and 99, got {_show(raw)}")
    return tuple(sorted(set(raw)))


def _probation(v: "_Validator", raw: Any) -> ProbationConfig:
    d, key = ProbationConfig(), "serving.probation"
    p = v.mapping(raw if raw is not None else {}, key, tuple(ProbationConfig.__dataclass_fields__))
    g = lambda name: p.get(name, getattr(d, name))  # noqa: E731
    return ProbationConfig(
        max_errors=v.integer(g("max_errors"), f"{key}.max_errors", 0, 1_000_000),
        max_nonfinite=v.integer(g("max_nonfinite"), f"{key}.max_nonfinite", 0, 1_000_000),
        ratio=_real(g("ratio"), f"{key}.ratio", 1.0, 100.0),
        slack_ms=_real(g("slack_ms"), f"{key}.slack_ms", 0.0, 60_000.0),
        quantiles=_quantiles(g("quantiles"), f"{key}.quantiles"),
        alpha=_real(g("alpha"), f"{key}.alpha", 1e-12, 0.5),
        p90_samples=v.integer(g("p90_samples"), f"{key}.p90_samples", 8, 4096),
        p99_samples=v.integer(g("p99_samples"), f"{key}.p99_samples", 100, 4096),
        rate_tolerance=_real(g("rate_tolerance"), f"{key}.rate_tolerance", 1.0, 1000.0),
        baseline_s=v.number(g("baseline_s"), f"{key}.baseline_s", 1.0, 86400.0),
        qualified_factor=_real(g("qualified_factor"), f"{key}.qualified_factor", 1.0, 1000.0),
        qualified_quantiles=_quantiles(g("qualified_quantiles"), f"{key}.qualified_quantiles"),
        min_requests=v.integer(g("min_requests"), f"{key}.min_requests", 0, 100_000_000),
        extend=_real(g("extend"), f"{key}.extend", 1.0, 100.0),
        referee=_flag(g("referee"), f"{key}.referee"),
    )


def _shadow(v: "_Validator", raw: Any) -> ShadowConfig:
    d, key = ShadowConfig(), "serving.shadow"
    if isinstance(raw, bool):  # `shadow: false` switches it off
        return replace(d, enabled=raw)
    p = v.mapping(raw if raw is not None else {}, key, tuple(ShadowConfig.__dataclass_fields__))
    g = lambda name: p.get(name, getattr(d, name))  # noqa: E731
    max_rel = g("max_rel")
    return ShadowConfig(
        enabled=_flag(g("enabled"), f"{key}.enabled"),
        requests=v.integer(g("requests"), f"{key}.requests", 1, 1_000_000),
        duration_s=v.number(g("duration_s"), f"{key}.duration_s", 0.1, 86400.0),
        min_requests=v.integer(g("min_requests"), f"{key}.min_requests", 1, 1_000_000),
        cpu_share=_real(g("cpu_share"), f"{key}.cpu_share", 0.001, 1.0),
        min_agreement=_real(g("min_agreement"), f"{key}.min_agreement", 0.0, 1.0),
        max_rel=None if max_rel is None else _real(max_rel, f"{key}.max_rel", 0.0, 1e9),
        max_failures=v.integer(g("max_failures"), f"{key}.max_failures", 0, 1_000_000),
        max_latency_ratio=_real(g("max_latency_ratio"), f"{key}.max_latency_ratio", 1.0, 1000.0),
        slack_ms=_real(g("slack_ms"), f"{key}.slack_ms", 0.0, 60_000.0),
    )


def _memory_max(raw: Any) -> int | None:
    from agent.util.sizes import parse_size

    if raw is None:
        return None
    try:
        return parse_size(raw)
    except ValueError as exc:
        raise ConfigError(f"serving.memory_max: {exc}") from None


def _telemetry(v: "_Validator", raw: Any) -> TelemetryConfig:
    t = v.mapping(raw if raw is not None else {}, "telemetry", ("interval_s",))
    return TelemetryConfig(interval_s=v.number(t.get("interval_s", 60.0), "telemetry.interval_s", 0, 86400))


def _groups(v: "_Validator", raw: Any) -> tuple[str, ...]:
    if raw is None:
        return ()
    if not isinstance(raw, list):
        raise ConfigError(f"groups: expected a list of group names, got {_show(raw)}")
    return tuple(dict.fromkeys(v.name(g, f"groups[{i}]") for i, g in enumerate(raw)))


def _target(v: "_Validator", raw: Any) -> str:
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


# ---------------------------------------------------------------- validator


def _show(value: Any) -> str:
    """How a wrong value is shown in an error: its kind for containers, else its repr."""
    if isinstance(value, bool):
        return f"a boolean ({str(value).lower()})"
    if isinstance(value, dict):
        return "a mapping"
    if isinstance(value, list):
        return "a list"
    return "nothing (null)" if value is None else repr(value)


class _Validator:
    """Typed getters that raise ConfigError naming the key path; relative paths resolve against base_dir."""

    def __init__(self, base_dir: Path):
        self.base_dir = base_dir

    def mapping(self, raw: Any, where: str, allowed: tuple[str, ...]) -> dict:
        if not isinstance(raw, dict):
            label = where or "config"
            raise ConfigError(f"{label}: expected a mapping, got {_show(raw)}")
        for key in raw:
            if key not in allowed:
                close = difflib.get_close_matches(str(key), allowed, n=1)
                hint = f" (did you mean {close[0]!r}?)" if close else ""
                full = f"{where}.{key}" if where else str(key)
                raise ConfigError(f"{full}: unknown key{hint}; allowed here: {', '.join(allowed)}")
        return raw

    def string(self, raw: Any, key: str) -> str:
        if not isinstance(raw, str) or not raw.strip():
            raise ConfigError(f"{key}: expected a non-empty string, got {_show(raw)}")
        return raw.strip()

    def name(self, raw: Any, key: str) -> str:
        if isinstance(raw, int) and not isinstance(raw, bool):
            raw = str(raw)
        s = self.string(raw, key)
        if not is_valid_name(s):
            raise ConfigError(
                f"{key}: expected 1-64 characters of [A-Za-z0-9._-] starting with a letter or digit, got {s!r}"
            )
        return s

    def integer(self, raw: Any, key: str, lo: int, hi: int) -> int:
        if isinstance(raw, bool) or not isinstance(raw, int):
            raise ConfigError(f"{key}: expected an integer {lo}-{hi}, got {_show(raw)}")
        if not lo <= raw <= hi:
            raise ConfigError(f"{key}: expected an integer {lo}-{hi}, got {raw}")
        return raw

    def number(self, raw: Any, key: str, lo: float, hi: float) -> float:
        if isinstance(raw, bool) or not isinstance(raw, (int, float)):
            raise ConfigError(f"{key}: expected a number of seconds {lo:g}-{hi:g}, got {_show(raw)}")
        if not lo <= raw <= hi or raw != raw:
            raise ConfigError(f"{key}: expected a number of seconds {lo:g}-{hi:g}, got {raw}")
        return float(raw)

    def path(self, raw: Any, key: str) -> Path:
        s = self.string(raw, key)
        if "\0" in s:
            raise ConfigError(f"{key}: path contains a NUL byte")
        p = Path(os.path.expanduser(s)) if s.startswith("~") else Path(s)
        return p if p.is_absolute() else (self.base_dir / p)
