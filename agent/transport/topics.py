"""The MQTT topic tree: pure build/parse of every topic under a prefix, and validation of ids."""

from __future__ import annotations

from dataclasses import dataclass

from agent import names
from agent.errors import TransportError
from agent.names import is_valid_name

DEFAULT_PREFIX = "edge"
SHARE_GROUP = "edge-artifacts"


def check_name(value: object, kind: str = "name", error: type[Exception] = TransportError) -> str:
    """agent.names.check_name, raising TransportError unless told otherwise (topic segments)."""
    return names.check_name(value, kind, error)


def check_prefix(prefix: object) -> str:
    """A prefix is one or more '/'-separated name segments (no wildcards, no leading '/' or '$')."""
    if not isinstance(prefix, str) or not prefix:
        raise TransportError(f"invalid topic prefix {prefix!r}")
    for seg in prefix.split("/"):
        if not is_valid_name(seg):
            raise TransportError(f"invalid topic prefix {prefix!r}: segment {seg!r} is not allowed")
    return prefix


@dataclass(frozen=True)
class Parsed:
    """A parsed topic: kind is one of device_desired, group_desired, status, events, health,
    artifact_req, artifacts, rollout."""

    kind: str
    device: str | None = None
    group: str | None = None
    model: str | None = None
    rollout: str | None = None


@dataclass(frozen=True)
class Topics:
    """Every topic of the protocol under one prefix (see docs/protocol.md)."""

    prefix: str = DEFAULT_PREFIX

    def __post_init__(self) -> None:
        check_prefix(self.prefix)

    # --- builders -------------------------------------------------------------------------------
    def device_desired(self, device: str, model: str) -> str:
        return f"{self.prefix}/devices/{check_name(device, 'device id')}/desired/{check_name(model, 'model name')}"

    def group_desired(self, group: str, model: str) -> str:
        return f"{self.prefix}/groups/{check_name(group, 'group')}/desired/{check_name(model, 'model name')}"

    def status(self, device: str) -> str:
        return f"{self.prefix}/devices/{check_name(device, 'device id')}/status"

    def events(self, device: str) -> str:
        return f"{self.prefix}/devices/{check_name(device, 'device id')}/events"

    def health(self, device: str) -> str:
        return f"{self.prefix}/devices/{check_name(device, 'device id')}/health"

    def artifact_req(self, device: str) -> str:
        return f"{self.prefix}/artifacts/req/{check_name(device, 'device id')}"

    def artifacts(self, device: str) -> str:
        return f"{self.prefix}/devices/{check_name(device, 'device id')}/artifacts"

    def rollout(self, rollout_id: str) -> str:
        return f"{self.prefix}/rollouts/{check_name(rollout_id, 'rollout id')}"

    # --- subscription filters -------------------------------------------------------------------
    def device_desired_filter(self, device: str) -> str:
        return f"{self.prefix}/devices/{check_name(device, 'device id')}/desired/+"

    def group_desired_filter(self, group: str) -> str:
        return f"{self.prefix}/groups/{check_name(group, 'group')}/desired/+"

    def all_status(self) -> str:
        return f"{self.prefix}/devices/+/status"

    def all_events(self) -> str:
        return f"{self.prefix}/devices/+/events"

    def artifact_req_filter(self, shared: bool) -> str:
        """Servers subscribe here; `$share/edge-artifacts/...` on MQTT 5 so one server answers each request."""
        base = f"{self.prefix}/artifacts/req/+"
        return f"$share/{SHARE_GROUP}/{base}" if shared else base

    # --- parser ---------------------------------------------------------------------------------
    def parse(self, topic: str) -> Parsed | None:
        """Parse a topic of this tree; None for anything else (including invalid ids)."""
        head = self.prefix + "/"
        if not isinstance(topic, str) or not topic.startswith(head):
            return None
        parts = topic[len(head) :].split("/")
        if not all(is_valid_name(p) for p in parts[1:] if p not in ("desired", "req")):
            return None
        if parts[0] == "devices" and len(parts) == 4 and parts[2] == "desired":
            return Parsed("device_desired", device=parts[1], model=parts[3])
        if parts[0] == "devices" and len(parts) == 3 and parts[2] in ("status", "events", "health", "artifacts"):
            return Parsed(parts[2], device=parts[1])
        if parts[0] == "groups" and len(parts) == 4 and parts[2] == "desired":
            return Parsed("group_desired", group=parts[1], model=parts[3])
        if parts[0] == "artifacts" and len(parts) == 3 and parts[1] == "req":
            return Parsed("artifact_req", device=parts[2])
        if parts[0] == "rollouts" and len(parts) == 2:
            return Parsed("rollout", rollout=parts[1])
        return None


def filter_matches(topic_filter: str, topic: str) -> bool:
    """Does `topic` match the MQTT subscription filter (+, #, and a $share/<group>/ prefix)?"""
    if topic_filter.startswith("$share/"):
        topic_filter = topic_filter.split("/", 2)[2]
    f, t = topic_filter.split("/"), topic.split("/")
    for i, part in enumerate(f):
        if part == "#":
            return True
        if i >= len(t) or (part != "+" and part != t[i]):
            return False
    return len(f) == len(t)
