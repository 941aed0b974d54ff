"""Matching a hardware profile to the most specific target, the target a device runs under, and the features
the device really has."""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from agent.errors import ConfigError
from agent.targets.load import get_target, load_targets
from agent.targets.schema import CPU_FEATURES, HARDWARE_FEATURES, Target

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile


def _any_in(needles: list[str], haystack: list[str]) -> bool:
    hay = [h.lower() for h in haystack if h]
    return any(n.lower() in h for n in needles for h in hay)


def rule_matches(rules: Mapping[str, Any], profile: HardwareProfile) -> bool:
    """Every rule present must hold; within one rule a list means any-of (substring, case-insensitive)."""
    checks = {
        "arch": lambda v: profile.arch in v,
        "compatible": lambda v: _any_in(v, list(profile.software.get("dt_compatible") or ())),
        "soc": lambda v: _any_in(v, [profile.soc or ""]),
        "cpu_vendor": lambda v: _any_in(v, [profile.cpu.vendor or ""]),
        "os": lambda v: _any_in(v, [profile.os or ""]),
        "accelerators": lambda v: all(profile.has_accelerator(a.get("kind"), a.get("vendor")) for a in v),
    }
    return all(checks[k](v) for k, v in rules.items() if k in checks)


def match(profile: HardwareProfile, targets: Mapping[str, Target] | None = None) -> Target:
    """The most specific matching target (highest priority, then name); a generic fallback otherwise."""
    targets = targets if targets is not None else load_targets()
    hits = [t for t in targets.values() if rule_matches(t.match_rules, profile)]
    if hits:
        return sorted(hits, key=lambda t: (-t.priority, t.name))[0]
    fallbacks = sorted(
        (t for t in targets.values() if t.match_rules.get("fallback")), key=lambda t: (t.priority, t.name)
    )
    if not fallbacks:
        raise ConfigError("no target matches and no target is marked 'match: {fallback: true}'")
    return fallbacks[0]


def resolve(profile: HardwareProfile, name: str | None = None) -> Target:
    """The target a device runs under: the one named (config `target`, --target), else the hardware's match.
    None, "" and "auto" mean "match"."""
    return match(profile) if name in (None, "", "auto") else get_target(str(name))


def with_target(profile: HardwareProfile) -> HardwareProfile:
    """The profile with `target` set to its match; a broken targets directory becomes a note, never an error."""
    import dataclasses

    try:
        target = match(profile)
    except Exception as exc:  # noqa: BLE001 - a bad targets directory must not break profiling
        return dataclasses.replace(profile, notes=profile.notes + (f"targets: {exc}",))
    notes = profile.notes
    if profile.arch is None:
        notes += (f"arch unknown: target {target.name} is a fallback guess",)
    return dataclasses.replace(profile, target=target.name, notes=notes)


def detect_device(root: str | os.PathLike[str] = "/", *, use_host_tools: bool | None = None) -> HardwareProfile:
    """agent.hardware.detect(root) with the matching target filled in; never raises."""
    from agent.hardware import detect

    return with_target(detect(root, use_host_tools=use_host_tools))


def features_for(profile: HardwareProfile, target: Target) -> frozenset[str]:
    """Features this device really has: the target's software features (cuda, tensorrt, ...) plus what the
    profile confirms (cpu flags, accelerator kinds and vendor-kind pairs such as 'intel-npu')."""
    derived = {CPU_FEATURES[f] for f in profile.cpu.flags if f in CPU_FEATURES}
    for acc in profile.accelerators:
        derived |= {acc.kind, f"{acc.vendor}-{acc.kind}"}
    if profile.arch:
        derived.add(profile.arch)
    return frozenset((target.features - HARDWARE_FEATURES) | derived)
