"""Why a case did not pass, in a few words: the causes that explain a provider's failed/errored/skipped counts."""

from __future__ import annotations

import re
from collections import Counter, defaultdict
from typing import Any

# (status, pattern on the reason, cause); first match wins. Patterns come from the runtimes' own messages.
_RULES: tuple[tuple[str, str, str], ...] = (
    ("skipped", r"^unavailable", "provider unavailable here"),
    ("skipped", r"time budget", "the model's time budget was spent"),
    ("errored", r"timed out after", "timed out (child killed)"),
    ("errored", r"worker crashed", "the runtime crashed (child process)"),
    ("errored", r"fallback to CPU EP has been explicitly disabled", "the EP took no node (would fall back to CPU)"),
    (
        "*",  # whatever status the case ended in: the runtime named an operator it does not implement
        r"unsupported operator|Could not find an implementation|NOT_IMPLEMENTED|No conversion rule|not implemented",
        "operator (or this opset/type of it) not implemented",
    ),
    (
        "errored",
        r"Numpy_type \d+ can't be converted|No corresponding Numpy type|Unsupported type|unsupported element type|"
        r"not supported.*type|type.*not supported",
        "tensor type the runtime or its Python API cannot carry (float8, int4, int2, ...)",
    ),
    ("errored", r"dynamic rank|dynamic shape", "shape the runtime cannot compile (dynamic rank)"),
    (
        "errored",
        r"wasn't fully converted|While validating",
        "the frontend refused this node's inputs (constant-only inputs, attributes, types)",
    ),
    (
        "errored",
        r"Exception during initialization|Non-zero status code",
        "the kernel refused these attributes or inputs",
    ),
    ("errored", r"^session:", "session refused (other)"),
    ("errored", r"^run:", "inference failed (other)"),
    ("failed", r"dtype\(", "output dtype differs from onnx's"),
    ("failed", r"nan location mismatch|inf location mismatch", "NaN/Inf in different places"),
    ("failed", r"shapes|shape mismatch|\(shapes", "output shape differs"),
    ("failed", r"Mismatched elements|Not equal to tolerance", "values outside onnx's tolerance"),
    ("failed", r"accuracy", "outside the target's accuracy tolerance"),
)
_COMPILED = tuple((s, re.compile(p, re.IGNORECASE), c) for s, p, c in _RULES)


def cause_of(status: str, reason: str) -> str:
    for s, pat, cause in _COMPILED:
        if s in (status, "*") and pat.search(reason or ""):
            return cause
    return f"{status} (other)"


def explain(cases: list[dict[str, Any]]) -> dict[str, dict[str, dict[str, int]]]:
    """provider key -> status -> cause -> count, for every case that did not pass; most frequent cause first."""
    by: dict[str, dict[str, Counter]] = defaultdict(lambda: defaultdict(Counter))
    for c in cases:
        if c["status"] != "passed":
            by[c["provider"]][c["status"]][cause_of(c["status"], c.get("reason") or "")] += 1
    return {k: {s: dict(cnt.most_common()) for s, cnt in v.items()} for k, v in by.items()}
