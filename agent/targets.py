"""Target profiles: load and validate targets/*.yaml, match a HardwareProfile to the most specific one."""

from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.errors import ConfigError
from agent.providers import PROVIDER_NAMES
from agent.util import yamlsafe
from agent.util.textfile import read_text

if TYPE_CHECKING:  # pragma: no cover
    from agent.hardware.profile import HardwareProfile

ENV_DIR = "EDGE_AGENT_TARGETS_DIR"
PRECISIONS = ("fp32", "fp16", "bf16", "int8")
PRECISION_ALIASES = {
    None: "fp32",
    "fp32": "fp32",
    "f32": "fp32",
    "float32": "fp32",
    "float": "fp32",
    "fp16": "fp16",
    "f16": "fp16",
    "float16": "fp16",
    "half": "fp16",
    "bf16": "bf16",
    "bfloat16": "bf16",
    "int8": "int8",
    "i8": "int8",
    "u8": "int8",
    "uint8": "int8",
    "qdq": "int8",
}
SWAPS = ("make-before-break", "stop-then-start")
TASKS = ("detection", "classification", "regression", "embeddings")  # `tasks:` tolerance sections
_TASK_STEMS = {
    "detection": ("detect",),
    "classification": ("classif",),
    "regression": ("regress",),
    "embeddings": ("embed",),
}
OPTIMIZE_KINDS = ("ort-basic", "ort-extended", "ort-all", "slim", "fusions")  # agent.qualify.optimize
TOP_KEYS = {"name", "description", "match", "providers", "tolerances", "serving", "features", "tasks", "qualify"}
MATCH_KEYS = {"priority", "fallback", "arch", "compatible", "soc", "cpu_vendor", "os", "accelerators"}
TOLERANCE_KEYS = ("max_abs", "max_rel", "min_cosine", "top1_agreement")
# Features a profile can confirm itself (cpu flag or accelerator -> feature); see features_for().
CPU_FEATURES = {
    "avx2": "avx2",
    "avx512f": "avx512f",
    "avx512_bf16": "avx512_bf16",
    "avx512_vnni": "avx512_vnni",
    "avx_vnni": "avx_vnni",
    "avx512_fp16": "avx512_fp16",
    "amx_tile": "amx",
    "amx_bf16": "amx_bf16",
    "amx_int8": "amx_int8",
    "asimd": "neon",
    "neon": "neon",
    "asimdhp": "fp16",
    "FEAT_FP16": "fp16",
    "asimddp": "dotprod",
    "FEAT_DotProd": "dotprod",
    "i8mm": "i8mm",
    "FEAT_I8MM": "i8mm",
    "bf16": "bf16",
    "FEAT_BF16": "bf16",
    "sve": "sve",
    "sve2": "sve2",
    "sme": "sme",
    "FEAT_SME": "sme",
}
HARDWARE_FEATURES = frozenset(CPU_FEATURES.values()) | {"gpu", "npu", "dsp", "tpu"}


def normalize_precision(precision: str | None) -> str:
    """'f32'/'float32'/None -> 'fp32', 'f16' -> 'fp16', ...; ConfigError for unknown names."""
    key = precision.lower() if isinstance(precision, str) else precision
    if key not in PRECISION_ALIASES:
        raise ConfigError(f"unknown precision {precision!r}; known: {', '.join(PRECISIONS)} (and f32, f16, i8, ...)")
    return PRECISION_ALIASES[key]


@dataclass(frozen=True)
class Tolerance:
    """Accuracy bounds against the fp32 CPU reference. An element passes when
    |got - ref| <= max_abs + max_rel * scale, where scale = max |ref| over the output (numpy allclose style,
    relative to the output's scale so near-zero elements do not explode). Whole outputs also need
    cosine >= min_cosine and, for classifiers, argmax agreement >= top1_agreement (fraction of samples)."""

    max_abs: float
    max_rel: float
    min_cosine: float
    top1_agreement: float
    min_sqnr_db: float | None = None  # signal-to-quantization-noise ratio floor per output (dB); None: not checked

    def allows(self, abs_err: float, scale: float) -> bool:
        return abs_err <= self.max_abs + self.max_rel * abs(scale)

    def to_dict(self) -> dict[str, float]:
        out = {k: getattr(self, k) for k in TOLERANCE_KEYS}
        if self.min_sqnr_db is not None:
            out["min_sqnr_db"] = self.min_sqnr_db
        return out


@dataclass(frozen=True)
class ToleranceTable:
    """provider -> precision -> Tolerance, with 'default'; call it as table(provider, precision)."""

    table: Mapping[str, Mapping[str, Tolerance]]

    def __call__(self, provider: str, precision: str | None = None) -> Tolerance:
        p = normalize_precision(precision)
        return self.table.get(provider, {}).get(p) or self.table["default"][p]

    def __hash__(self) -> int:
        return hash(tuple(sorted(self.table)))


@dataclass(frozen=True)
class ProviderPref:
    name: str
    options: dict[str, Any] = field(default_factory=dict)
    exclude: str | None = None  # the stated reason this provider is never measured on the target

    def __hash__(self) -> int:
        return hash(self.name)


@dataclass(frozen=True)
class Target:
    name: str
    description: str
    providers: tuple[ProviderPref, ...]
    tolerances: ToleranceTable
    serving: dict[str, Any]
    features: frozenset[str]
    match_rules: dict[str, Any] = field(default_factory=dict, repr=False)
    path: str | None = field(default=None, repr=False, compare=False)
    tasks: dict[str, dict[str, dict[str, Any]]] = field(default_factory=dict, repr=False)  # agent.qualify.tasks
    qualify: dict[str, Any] = field(default_factory=dict, repr=False)  # optimize, cold_start_budget_s

    @property
    def optimize(self) -> tuple[str, ...]:
        """Optimisation variants qualification measures on this target (agent.qualify.optimize.KINDS)."""
        return tuple(self.qualify.get("optimize") or ())

    def __hash__(self) -> int:
        return hash(self.name)

    def tolerance(self, provider: str, precision: str | None = None) -> Tolerance:
        """Bounds for `provider` at `precision` (None = fp32), falling back to the target's defaults."""
        return self.tolerances(provider, precision)

    @property
    def provider_names(self) -> tuple[str, ...]:
        return tuple(p.name for p in self.providers)

    def provider_options(self, name: str) -> dict[str, Any]:
        return next((dict(p.options) for p in self.providers if p.name == name), {})

    @property
    def priority(self) -> int:
        return int(self.match_rules.get("priority", 0))

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "description": self.description,
            "providers": [
                {"name": p.name, "options": dict(p.options), **({"exclude": p.exclude} if p.exclude else {})}
                for p in self.providers
            ],
            "tolerances": {
                prov: {prec: t.to_dict() for prec, t in by.items()} for prov, by in self.tolerances.table.items()
            },
            "serving": dict(self.serving),
            "features": sorted(self.features),
            "match": dict(self.match_rules),
        }


def default_directory() -> Path:
    """$EDGE_AGENT_TARGETS_DIR, else the repository's targets/ next to the agent package, else
    <prefix>/share/edge-agent/targets (where a packaged install would put them)."""
    env = os.environ.get(ENV_DIR)
    if env:
        return Path(env)
    repo = Path(__file__).resolve().parent.parent / "targets"
    shared = Path(sys.prefix) / "share" / "edge-agent" / "targets"
    return repo if repo.is_dir() or not shared.is_dir() else shared


_CACHE: dict[str, dict[str, Target]] = {}


def load_targets(directory: str | os.PathLike[str] | None = None) -> dict[str, Target]:
    """All targets in `directory` (default: see default_directory()), by name. Raises ConfigError."""
    d = Path(directory) if directory is not None else default_directory()
    if not d.is_dir():
        raise ConfigError(f"targets directory {d} does not exist (set {ENV_DIR} or reinstall)")
    files = sorted(p for p in d.glob("*.yaml") if not p.name.startswith(("_", ".")))
    key = str(d.resolve()) + "|" + "|".join(f"{p.name}:{p.stat().st_mtime_ns}" for p in files)
    if key in _CACHE:
        return dict(_CACHE[key])
    if not files:
        raise ConfigError(f"targets directory {d} has no *.yaml files")
    targets: dict[str, Target] = {}
    for p in files:
        t = parse_target(p)
        targets[t.name] = t
    _CACHE.clear()
    _CACHE[key] = targets
    return dict(targets)


def get_target(name: str, directory: str | os.PathLike[str] | None = None) -> Target:
    targets = load_targets(directory)
    if name not in targets:
        raise ConfigError(f"unknown target {name!r}; valid targets: {', '.join(sorted(targets))}")
    return targets[name]


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


# ---- validation: every error names the file and the key path ----


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
    if not isinstance(raw, dict) or set(raw) - set(TOLERANCE_KEYS) - {"min_sqnr_db"}:
        raise _fail(path, key, f"expected a mapping with {', '.join(TOLERANCE_KEYS)} (and min_sqnr_db)")
    values = base.to_dict() if base else {}
    for k, v in raw.items():
        if not isinstance(v, (int, float)) or isinstance(v, bool) or v < 0:
            raise _fail(path, f"{key}.{k}", "expected a non-negative number")
        if k == "min_sqnr_db" and isinstance(v, (int, float)) and not isinstance(v, bool):
            values[k] = float(v)
            continue
        if k in ("min_cosine", "top1_agreement") and v > 1:
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
    if raw.get("unjudged", "commit-flagged") not in ("commit-flagged", "rollback"):
        raise _fail(path, "serving.unjudged", f"{raw['unjudged']!r} is not one of commit-flagged, rollback")
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


def task_of(task: str | None) -> str | None:
    """model.yaml `task` -> one of TASKS (object-detection -> detection, image-classification ->
    classification, sentence-embeddings -> embeddings, ...), else None."""
    low = (task or "").lower()
    for name, stems in _TASK_STEMS.items():
        if any(stem in low for stem in stems):
            return name
    return None


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
            if not isinstance(bounds, dict) or set(bounds) - set(TOLERANCE_KEYS) - {"min_sqnr_db"}:
                raise _fail(path, key, f"expected a mapping with some of {', '.join(TOLERANCE_KEYS)}, min_sqnr_db")
            for k, v in bounds.items():
                ok = v is None or (isinstance(v, (int, float)) and not isinstance(v, bool))
                if not ok or (k != "min_sqnr_db" and v is not None and v < 0):
                    raise _fail(path, f"{key}.{k}", "expected a non-negative number or null")
            out[task][norm] = {k: None if v is None else float(v) for k, v in bounds.items()}
    return out


def _parse_qualify(path: Path, raw: Any) -> dict[str, Any]:
    if raw is None:
        return {}
    if not isinstance(raw, dict) or set(raw) - {"optimize", "cold_start_budget_s"}:
        raise _fail(path, "qualify", "expected a mapping with optimize and/or cold_start_budget_s")
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
    return out
