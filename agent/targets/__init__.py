"""Target profiles: load and validate targets/*.yaml, match a HardwareProfile to the most specific one.

`schema` holds Target and its parts, `parse` validates one file, `load` finds and loads them all, `matching`
picks the target for a profile. Import from here."""

from __future__ import annotations

from agent.targets.load import ENV_DIR, default_directory, get_target, load_targets
from agent.targets.matching import detect_device, features_for, match, resolve, rule_matches, with_target
from agent.targets.parse import parse_target
from agent.targets.schema import (
    CPU_FEATURES,
    HARDWARE_FEATURES,
    MATCH_KEYS,
    OPTIMIZE_KINDS,
    PRECISION_ALIASES,
    PRECISIONS,
    SWAPS,
    TASKS,
    TOLERANCE_KEYS,
    TOP_KEYS,
    ProviderPref,
    Target,
    Tolerance,
    ToleranceTable,
    normalize_precision,
    task_of,
)

__all__ = [
    "CPU_FEATURES",
    "ENV_DIR",
    "HARDWARE_FEATURES",
    "MATCH_KEYS",
    "OPTIMIZE_KINDS",
    "PRECISIONS",
    "PRECISION_ALIASES",
    "SWAPS",
    "TASKS",
    "TOLERANCE_KEYS",
    "TOP_KEYS",
    "ProviderPref",
    "Target",
    "Tolerance",
    "ToleranceTable",
    "default_directory",
    "detect_device",
    "features_for",
    "get_target",
    "load_targets",
    "match",
    "normalize_precision",
    "parse_target",
    "resolve",
    "rule_matches",
    "task_of",
    "with_target",
]
