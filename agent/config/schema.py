"""The agent configuration's schema (agent.yaml): frozen dataclasses, their defaults, and the secret-file rule."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from agent.config.generative import GenerativeServing
from agent.errors import ConfigError
from agent.trial.settings import ProbationConfig, ShadowConfig
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
    # package-relative paths a model signature need not cover (none by default; each ignored file is journalled)
    model_signing_ignore_paths: tuple[str, ...] = ()


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
    shm_in_place: bool = False  # shared memory mapped and used in place (trusted clients: a truncation can fault)
    probation: ProbationConfig = ProbationConfig()
    shadow: ShadowConfig = ShadowConfig()
    generative: GenerativeServing = GenerativeServing()  # agent.config.generative (docs/generative.md)

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
class ControlPlaneConfig:
    """The control plane this daemon enrolls with and reports to (docs/control-plane.md, "The daemon's side")."""

    url: str  # http(s)://host[:port][/path]
    token_file: Path | None = None  # a pre-shared enrollment token (accepted at once); None: wait as pending
    report: bool = True  # post decision records (with their attestations) after each qualification
    retry_max_s: float = 60.0  # back-off ceiling while the control plane is unreachable or refuses

    def token(self) -> str | None:
        if self.token_file is None:
            return None
        token = first_line(self.token_file, "control_plane.token_file")
        if not token:
            raise ConfigError(f"control_plane.token_file: {self.token_file} is empty")
        return token


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
    control_plane: ControlPlaneConfig | None = None  # None: no control plane (fleet CLI and broker only)

    @property
    def mode(self) -> str:
        return "local" if self.mqtt is None else "mqtt"

    @property
    def cache_dir(self) -> Path:
        return self.state_dir / "cache"

    def to_dict(self) -> dict[str, Any]:
        """JSON-friendly resolved view (paths as strings; secrets are never read here)."""
        view: dict[str, Any] = _jsonable(asdict(self))
        return view | {"mode": self.mode}


def _jsonable(obj: Any) -> Any:
    if isinstance(obj, dict):
        return {k: _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return str(obj) if isinstance(obj, Path) else obj
