"""Validation of one target file (targets/*.yaml): every error names the file and the key path."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.errors import ConfigError
from agent.providers import PROVIDER_NAMES
from agent.targets.schema import (
    MATCH_KEYS,
    OPTIMIZE_KINDS,
    OPTIONAL_TOLERANCE_KEYS,
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
)
from agent.util import yamlsafe
from agent.util.textfile import read_text


def _fail(path: Path, key: str, why: str) -> ConfigError:
    return ConfigError(f"{path.name}: {key}: {why}")


def _str_list(path: Path, key: str, value: Any) -> list[str]:
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list) or not items or not all(isinstance(x, str) and x for x in items):
        raise _fail(path, key, "expected a string or a non-empty list of strings")
    return items


def _parse_match(path: Path, raw: Any) -> dict[str, Any]:
    if not isinstance(raw, dict):
        raise _fail(path, "match", "expected a mapping of rules")
    unknown = set(raw) - MATCH_KEYS
    if unknown:
        raise _fail(path, f"match.{sorted(unknown)[0]}", f"unknown rule; known: {', '.join(sorted(MATCH_KEYS))}")
    rules: dict[str, Any] = {}
    for key, value in raw.items():
        if key == "priority":
            if not isinstance(value, int) or isinstance(value, bool):
                raise _fail(path, "match.priority", "expected an integer")
            rules[key] = value
        elif key == "fallback":
            if not isinstance(value, bool):
                raise _fail(path, "match.fallback", "expected true or false")
            rules[key] = value
        elif key == "accelerators":
            ok = isinstance(value, list) and all(
                isinstance(a, dict) and a and set(a) <= {"kind", "vendor"} for a in value
            )
            if not ok:
                raise _fail(path, "match.accelerators", "expected a list of {kind, vendor} mappings")
            rules[key] = value
        else:
            rules[key] = _str_list(path, f"match.{key}", value)
    for bad in set(rules.get("arch", ())) - {"x86_64", "aarch64"}:
        raise _fail(path, "match.arch", f"{bad!r} is not x86_64 or aarch64")
    return rules


def _parse_providers(path: Path, raw: Any) -> tuple[ProviderPref, ...]:
    if not isinstance(raw, list) or not raw:
        raise _fail(path, "providers", "expected a non-empty list of {name, options}")
    out: list[ProviderPref] = []
    for i, item in enumerate(raw):
        item = {"name": item} if isinstance(item, str) else item
        if not isinstance(item, dict) or set(item) - {"name", "options", "exclude"}:
            raise _fail(path, f"providers[{i}]", "expected {name, options} (and exclude: reason)")
        if "exclude" in item and not (isinstance(item["exclude"], str) and item["exclude"].strip()):
            raise _fail(path, f"providers[{i}].exclude", "expected the reason, as a non-empty string")
        name, options = item.get("name"), item.get("options") or {}
        if name not in PROVIDER_NAMES:
            raise _fail(path, f"providers[{i}].name", f"{name!r} is not one of {', '.join(PROVIDER_NAMES)}")
        if not isinstance(options, dict):
            raise _fail(path, f"providers[{i}].options", "expected a mapping")
        if name in (p.name for p in out):
            raise _fail(path, f"providers[{i}].name", f"{name!r} is listed twice")
        out.append(ProviderPref(name=name, options=dict(options), exclude=item.get("exclude")))
    return tuple(out)


def _parse_tolerance(path: Path, key: str, raw: Any, base: Tolerance | None) -> Tolerance:
    if not isinstance(raw, dict) or set(raw) - set(TOLERANCE_KEYS) - set(OPTIONAL_TOLERANCE_KEYS):
        raise _fail(
            path, key, f"expected a mapping with {', '.join(TOLERANCE_KEYS)} (and {', '.join(OPTIONAL_TOLERANCE_KEYS)})"
        )
    values = base.to_dict() if base else {}
    for k, v in raw.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise _fail(path, f"{key}.{k}", "expected a non-negative number")
        if k == "min_sqnr_db" and isinstance(v, (int, float)) and not isinstance(v, bool):
            values[k] = float(v)
            continue
        if k in ("min_cosine", "top1_agreement", "max_length_change") and v > 1:
            raise _fail(path, f"{key}.{k}", "expected a number between 0 and 1")
        values[k] = float(v)
    missing = [k for k in TOLERANCE_KEYS if k not in values]
    if missing:
        raise _fail(path, f"{key}.{missing[0]}", "missing")
    return Tolerance(**values)


def _parse_tolerances(path: Path, raw: Any) -> ToleranceTable:
    if not isinstance(raw, dict) or not isinstance(raw.get("default"), dict):
        raise _fail(path, "tolerances.default", "missing; it needs fp32, fp16, bf16 and int8")
    table: dict[str, dict[str, Tolerance]] = {}
    for prov in ["default"] + [k for k in raw if k != "default"]:
        if prov != "default" and prov not in PROVIDER_NAMES:
            raise _fail(path, f"tolerances.{prov}", f"not a provider name ({', '.join(PROVIDER_NAMES)})")
        by_prec = raw[prov]
        if not isinstance(by_prec, dict):
            raise _fail(path, f"tolerances.{prov}", "expected precision -> bounds")
        table[prov] = {}
        for prec, bounds in by_prec.items():
            try:
                norm = normalize_precision(str(prec))
            except ConfigError as exc:
                raise _fail(path, f"tolerances.{prov}.{prec}", str(exc)) from None
            base = None if prov == "default" else table["default"][norm]
            table[prov][norm] = _parse_tolerance(path, f"tolerances.{prov}.{prec}", bounds, base)
    for prec in PRECISIONS:
        if prec not in table["default"]:
            raise _fail(path, f"tolerances.default.{prec}", "missing")
    return ToleranceTable(table=table)


def _parse_serving(path: Path, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {"swap": "make-before-break"}
    if not isinstance(raw, dict):
        raise _fail(path, "serving", "expected a mapping")
    for key in ("swap", "swap_when_memory_short"):
        if key in raw and raw[key] not in SWAPS:
            raise _fail(path, f"serving.{key}", f"{raw[key]!r} is not one of {', '.join(SWAPS)}")
    if raw.get("unjudged", "rollback") not in ("rollback", "commit-flagged"):
        raise _fail(path, "serving.unjudged", f"{raw['unjudged']!r} is not one of rollback, commit-flagged")
    if raw.get("unchecked_accuracy", "allow") not in ("allow", "refuse"):
        raise _fail(path, "serving.unchecked_accuracy", f"{raw['unchecked_accuracy']!r} is not one of allow, refuse")
    if "memory_max" in raw and not isinstance(raw["memory_max"], (str, int)):
        raise _fail(path, "serving.memory_max", "expected a systemd size like 2G or 75%")
    return {"swap": "make-before-break", **raw}


def parse_target(path: Path) -> Target:
    """Read and validate one target YAML; ConfigError names the file and the key."""
    raw = yamlsafe.loads(read_text(path, path.name, ConfigError), path.name, ConfigError)
    if not isinstance(raw, dict):
        raise _fail(path, "(top level)", "expected a mapping")
    unknown = set(raw) - TOP_KEYS
    if unknown:
        raise _fail(path, sorted(unknown)[0], f"unknown key; known: {', '.join(sorted(TOP_KEYS))}")
    name = raw.get("name")
    if name != path.stem:
        raise _fail(path, "name", f"{name!r} must equal the file name {path.stem!r}")
    if not isinstance(raw.get("description"), str) or not raw["description"].strip():
        raise _fail(path, "description", "expected a non-empty string")
    features = raw.get("features") or []
    if not isinstance(features, list) or not all(isinstance(f, str) for f in features):
        raise _fail(path, "features", "expected a list of strings")
    return Target(
        name=name,
        description=raw["description"].strip(),
        providers=_parse_providers(path, raw.get("providers")),
        tolerances=_parse_tolerances(path, raw.get("tolerances")),
        serving=_parse_serving(path, raw.get("serving")),
        features=frozenset(features),
        match_rules=_parse_match(path, raw.get("match") or {}),
        path=str(path),
        tasks=_parse_tasks(path, raw.get("tasks")),
        qualify=_parse_qualify(path, raw.get("qualify")),
    )


def _parse_tasks(path: Path, raw: Any) -> dict[str, dict[str, dict[str, Any]]]:
    """tasks: {task: {precision: bounds}}; a bound may be null (that check is off for the task)."""
    if raw is None:
        return {}
    if not isinstance(raw, dict):
        raise _fail(path, "tasks", f"expected task -> precision -> bounds; tasks: {', '.join(TASKS)}")
    out: dict[str, dict[str, dict[str, Any]]] = {}
    for task, by_prec in raw.items():
        if task not in TASKS:
            raise _fail(path, f"tasks.{task}", f"not a task ({', '.join(TASKS)})")
        if not isinstance(by_prec, dict):
            raise _fail(path, f"tasks.{task}", "expected precision -> bounds")
        out[task] = {}
        for prec, bounds in by_prec.items():
            key = f"tasks.{task}.{prec}"
            try:
                norm = normalize_precision(str(prec))
            except ConfigError as exc:
                raise _fail(path, key, str(exc)) from None
            if not isinstance(bounds, dict) or set(bounds) - set(TOLERANCE_KEYS) - set(OPTIONAL_TOLERANCE_KEYS):
                known = ", ".join(TOLERANCE_KEYS + OPTIONAL_TOLERANCE_KEYS)
                raise _fail(path, key, f"expected a mapping with some of {known}")
            for k, v in bounds.items():
                ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                if not ok or (k != "min_sqnr_db" and v is not None and v < 0):
                    raise _fail(path, f"{key}.{k}", "expected a non-negative number or null")
            out[task][norm] = {k: None if v is None else float(v) for k, v in bounds.items()}
    return out


def _parse_qualify(path: Path, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - {"optimize", "cold_start_budget_s", "generative"}:
        raise _fail(path, "qualify", "expected a mapping with optimize, cold_start_budget_s and/or generative")
    out: dict[str, Any] = {}
    kinds = raw.get("optimize") or []
    kinds = list(OPTIMIZE_KINDS) if kinds is True else kinds
    if not isinstance(kinds, list) or any(k not in OPTIMIZE_KINDS for k in kinds):
        raise _fail(path, "qualify.optimize", f"expected true or a list of {', '.join(OPTIMIZE_KINDS)}")
    out["optimize"] = [k for k in OPTIMIZE_KINDS if k in kinds]
    budget = raw.get("cold_start_budget_s")
    if budget is not None:
        if not isinstance(budget, (int, float)) or isinstance(budget, bool) or budget <= 0:
            raise _fail(path, "qualify.cold_start_budget_s", "expected a positive number of seconds")
        out["cold_start_budget_s"] = float(budget)
    if raw.get("generative") is not None:
        out["generative"] = _parse_generative_gates(path, raw["generative"])
    return out


GENERATIVE_GATES = ("min_top1", "max_logit_diff", "max_tpot_ms", "max_rss_mb")  # docs/generative.md


def _parse_generative_gates(path: Path, raw: Any) -> dict[str, float | None]:
    if not isinstance(raw, dict) or set(raw) - set(GENERATIVE_GATES):
        raise _fail(path, "qualify.generative", f"expected a mapping of {', '.join(GENERATIVE_GATES)}")
    for k, v in raw.items():
        if v is not None and (not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0):
            raise _fail(path, f"qualify.generative.{k}", "expected a non-negative number or null")
    return {k: None if v is None else float(v) for k, v in raw.items()}
