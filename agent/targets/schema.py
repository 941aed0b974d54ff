"""Target profiles' schema: the frozen Target, its tolerances and provider preferences, the precision and task
names a target file may use, and the features a hardware profile can confirm."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from agent.errors import ConfigError

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
OPTIONAL_TOLERANCE_KEYS = ("min_sqnr_db", "max_length_change")  # unset unless a target, task or model sets them
TOLERANCE_FIELDS = (*TOLERANCE_KEYS, *OPTIONAL_TOLERANCE_KEYS)  # every bound a model.yaml `tolerances:` may set
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
    cosine >= min_cosine and, for classifiers, argmax agreement >= top1_agreement (fraction of samples).
    One class for targets and qualification (agent.qualify.accuracy): a None bound is not checked (model.yaml
    may set one to null); a target's table sets every bound but min_sqnr_db."""

    max_abs: float | None = 1e-4
    max_rel: float | None = 1e-3
    min_cosine: float | None = 0.999
    top1_agreement: float | None = None
    min_sqnr_db: float | None = None  # signal-to-quantization-noise ratio floor per output (dB); None: not checked
    # an output whose length differs by at most this fraction is compared on its overlap; None: equal lengths
    max_length_change: float | None = None

    def allows(self, abs_err: float, scale: float) -> bool:
        return abs_err <= (self.max_abs or 0.0) + (self.max_rel or 0.0) * abs(scale)

    def to_dict(self) -> dict[str, float | None]:
        out = {k: getattr(self, k) for k in TOLERANCE_KEYS}
        for key in OPTIONAL_TOLERANCE_KEYS:
            if getattr(self, key) is not None:
                out[key] = getattr(self, key)
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


def task_of(task: str | None) -> str | None:
    """model.yaml `task` -> one of TASKS (object-detection -> detection, image-classification ->
    classification, sentence-embeddings -> embeddings, ...), else None."""
    low = (task or "").lower()
    for name, stems in _TASK_STEMS.items():
        if any(stem in low for stem in stems):
            return name
    return None
