"""Rollout planning (pure): device selection from retained status, cohorts, canary and wave split, thresholds."""

from __future__ import annotations

import math
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, TypedDict

from agent import names
from agent.errors import ConfigError
from agent.fleet.outcome import StatusDoc
from agent.names import is_valid_name


class PlannedCohort(TypedDict):
    waves: list[list[str]]  # device ids, the canary wave first when there is one
    canary: bool


class _PlannedOptional(TypedDict, total=False):
    previous_desired: str | None  # the device-specific desired state before the rollout (rollout_run's extras)


class PlannedDevice(_PlannedOptional):
    cohort: str
    wave: int
    previous_version: str | None
    previous_sha256: str | None


class Planned(TypedDict):
    """plan(): the cohorts and their waves, and each selected device's place and version before the rollout."""

    cohorts: dict[str, PlannedCohort]
    devices: dict[str, PlannedDevice]


VERSION_RE = re.compile(r"^[0-9]+(\.[0-9]+)*$")
COHORT_KEYS = ("target", "provider")
UNKNOWN = "unknown"


@dataclass(frozen=True)
class Count:
    """An absolute count ("5") or a percentage ("10%") of some population."""

    value: float
    percent: bool

    def __str__(self) -> str:
        return f"{self.value:g}%" if self.percent else str(int(self.value))

    def of(self, population: int, at_least_one: bool = True) -> int:
        """Resolve against a population: percentages round up, so 10% of 3 is 1, never 0 (unless value is 0)."""
        if not self.percent:
            return min(int(self.value), population)
        n = math.ceil(population * self.value / 100.0 - 1e-9)
        if at_least_one and self.value > 0 and population > 0:
            n = max(n, 1)
        return min(n, population)


def parse_count(text: str, what: str, allow_zero: bool = True) -> Count:
    """Parse "N" or "P%"; raise ConfigError naming the option on anything else."""
    s = str(text).strip()
    try:
        if s.endswith("%"):
            v = float(s[:-1])
            if not 0 <= v <= 100 or math.isnan(v):
                raise ValueError
            count = Count(v, True)
        else:
            if not s.isdigit():
                raise ValueError
            count = Count(int(s), False)
    except ValueError:
        raise ConfigError(f"{what}: expected a count N or a percentage P% (0-100%), got {text!r}") from None
    if not allow_zero and count.value == 0:
        raise ConfigError(f"{what}: must be more than 0, got {text!r}")
    return count


def parse_percent(text: str, what: str) -> float:
    """Parse "P%" (or a bare number meaning percent) into a fraction 0..1."""
    s = str(text).strip()
    try:
        v = float(s[:-1] if s.endswith("%") else s)
        if not 0 <= v <= 100 or math.isnan(v):
            raise ValueError
    except ValueError:
        raise ConfigError(f"{what}: expected a percentage like 10%, got {text!r}") from None
    return v / 100.0


def check_name(value: object, what: str) -> str:
    """agent.names' rule for a command-line or rollout name, as a ConfigError."""
    return names.check_name(value, what, ConfigError)


def check_version(value: str) -> str:
    if not isinstance(value, str) or not VERSION_RE.match(value):
        raise ConfigError(f"--version: {value!r} is not a dotted integer version like 3 or 2.0.1")
    return value


@dataclass(frozen=True)
class RolloutSpec:
    """What the operator asked for (persisted verbatim with the rollout)."""

    name: str
    version: str
    group: str | None = None  # None means --all
    cohort_by: str | None = None  # None | "target" | "provider"
    canary: str = "1"
    wave_size: str = "25%"
    max_failures: str = "0%"
    deadline_s: float = 600.0
    halt_on_unjudged: bool = False  # count devices whose probation could not judge the version as failures

    def validate(self) -> "RolloutSpec":
        check_name(self.name, "--name")
        check_version(self.version)
        if self.group is not None:
            check_name(self.group, "--group")
        if self.cohort_by not in (None, *COHORT_KEYS):
            raise ConfigError(f"--cohort-by: expected one of {', '.join(COHORT_KEYS)}, got {self.cohort_by!r}")
        parse_count(self.canary, "--canary")
        parse_count(self.wave_size, "--wave-size", allow_zero=False)
        parse_percent(self.max_failures, "--max-failures")
        if not self.deadline_s > 0:
            raise ConfigError(f"--deadline: must be more than 0 seconds, got {self.deadline_s}")
        return self

    @property
    def failure_budget(self) -> float:
        return parse_percent(self.max_failures, "--max-failures")

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "version": self.version,
            "group": self.group,
            "cohort_by": self.cohort_by,
            "canary": self.canary,
            "wave_size": self.wave_size,
            "max_failures": self.max_failures,
            "deadline_s": self.deadline_s,
            "halt_on_unjudged": self.halt_on_unjudged,
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> "RolloutSpec":
        return cls(**{k: d[k] for k in cls.__dataclass_fields__ if k in d})


def rollout_id(name: str, version: str) -> str:
    """Deterministic id, so re-running the same rollout command resumes it."""
    return check_name(f"{name}-{version}", "rollout id")


def select_devices(statuses: dict[str, StatusDoc], group: str | None) -> list[str]:
    """Devices in `group` (or all, when group is None) by their retained status, sorted by id."""
    out = []
    for dev_id, doc in statuses.items():
        if not isinstance(doc, dict) or not is_valid_name(str(dev_id)):
            continue
        groups = doc.get("groups") or []
        if group is None or (isinstance(groups, list) and group in groups):
            out.append(dev_id)
    return sorted(out)


def cohort_of(doc: StatusDoc, cohort_by: str | None, name: str | None = None) -> str:
    """The cohort key of one device: its target, or its primary (best available) provider; a status without
    a provider list falls back to the provider serving this model now."""
    if cohort_by is None:
        return "all"
    if cohort_by == "target":
        value = doc.get("target")
    else:
        providers = doc.get("providers") or []
        value = providers[0] if isinstance(providers, list) and providers else None
        serving = (doc.get("models") or {}).get(name) if name else None
        if value is None and isinstance(serving, dict):
            value = serving.get("provider")
    return str(value) if is_valid_name(value) else UNKNOWN


def current_version(doc: StatusDoc, name: str) -> str | None:
    m = (doc.get("models") or {}).get(name)
    v = m.get("version") if isinstance(m, dict) else None
    return v if isinstance(v, str) and VERSION_RE.match(v) else None


def current_sha(doc: StatusDoc, name: str) -> str | None:
    m = (doc.get("models") or {}).get(name)
    v = m.get("sha256") if isinstance(m, dict) else None
    return v if isinstance(v, str) and re.fullmatch(r"[0-9a-f]{64}", v) else None


def split_waves(devices: list[str], canary: Count, wave_size: Count) -> list[list[str]]:
    """Canary first (may be empty when --canary 0), then waves of wave_size (resolved on the cohort size)."""
    n_canary = canary.of(len(devices), at_least_one=canary.value > 0)
    waves = [devices[:n_canary]] if n_canary else []
    rest = devices[n_canary:]
    step = max(1, wave_size.of(len(devices)))
    waves += [rest[i : i + step] for i in range(0, len(rest), step)]
    return waves


def canary_order(ids: Iterable[str], statuses: dict[str, StatusDoc]) -> list[str]:
    """Online devices first (an offline canary only burns the deadline), then by id."""
    return sorted(ids, key=lambda d: (not bool(statuses.get(d, {}).get("online")), d))


def plan(spec: RolloutSpec, statuses: dict[str, StatusDoc]) -> Planned:
    """Select and split: {"cohorts": {key: {"waves": [[ids]]}}, "devices": {id: {cohort, wave, previous_version}}}."""
    selected = select_devices(statuses, spec.group)
    if not selected:
        where = f"group {spec.group!r}" if spec.group else "the fleet"
        raise ConfigError(
            f"no devices in {where}: no retained status found (are the devices online and in that group?)"
        )
    canary = parse_count(spec.canary, "--canary")
    wave = parse_count(spec.wave_size, "--wave-size", allow_zero=False)
    members: dict[str, list[str]] = {}
    for dev in selected:
        members.setdefault(cohort_of(statuses[dev], spec.cohort_by, spec.name), []).append(dev)
    cohorts: dict[str, PlannedCohort] = {}
    devices: dict[str, PlannedDevice] = {}
    for key in sorted(members):
        waves = split_waves(canary_order(members[key], statuses), canary, wave)
        cohorts[key] = {"waves": waves, "canary": bool(canary.of(len(members[key]), canary.value > 0))}
        for w, ids in enumerate(waves):
            for dev in ids:
                devices[dev] = {
                    "cohort": key,
                    "wave": w,
                    "previous_version": current_version(statuses[dev], spec.name),
                    "previous_sha256": current_sha(statuses[dev], spec.name),
                }
    return {"cohorts": cohorts, "devices": devices}


def over_budget(failed: int, attempted: int, budget: float) -> bool:
    """True when the failures among attempted devices pass the --max-failures fraction."""
    return attempted > 0 and failed > budget * attempted + 1e-9
