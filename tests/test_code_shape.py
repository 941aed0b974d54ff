"""Guards on what grows inside modules (issue 35): functions of agent/ stay under 60 lines unless listed here, and
ruff's function-shape allow-list (pyproject.toml: C901, PLR0913, PLR0915 per file) may only shrink. Mend a
function and take it off its list; a new long function is split, never listed."""

from __future__ import annotations

import ast
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
MAX_LINES = 60
GENERATED = ("agent/serving/proto/",)
SHAPE_RULES = {"C901", "PLR0913", "PLR0915"}

# functions over MAX_LINES lines when the guard came in (19 then; these may only go)
LONG_FUNCTIONS = {
    "agent/cli/fleet_rollout.py:rollout",
    "agent/cli/conformance.py:conformance",
    "agent/cli/fleet_simulate.py:simulate",
    "agent/cli/qualify.py:qualify",
    "agent/cli/fleet_rollout.py:rollback",
    "agent/cli/fleet.py:push",
    "agent/cli/fleet.py:status",
    "agent/serving/metrics.py:model_families",
    "agent/fleet/rollout_run.py:run_rollback",
    "agent/cli/providers.py:providers",
    "agent/cli/package.py:package",
    "agent/controlplane/migrations/versions/0001_initial.py:upgrade",
}
LONG_FUNCTIONS_MAX = 12  # only ever lowered
SHAPE_ALLOW_MAX = 40  # files of agent/ on ruff's function-shape allow-list; only ever lowered


def long_functions(root: Path) -> dict[str, int]:
    """FILE:NAME -> lines (decorators included) of every function of agent/ longer than MAX_LINES."""
    out: dict[str, int] = {}
    for path in sorted((root / "agent").rglob("*.py")):
        rel = path.relative_to(root).as_posix()
        if rel.startswith(GENERATED):
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
                start = node.decorator_list[0].lineno if node.decorator_list else node.lineno
                lines = (node.end_lineno or node.lineno) - start + 1
                if lines > MAX_LINES:
                    out[f"{rel}:{node.name}"] = lines
    return out


def shape_allow_list(root: Path) -> dict[str, set[str]]:
    """pyproject's per-file ignores of the function-shape rules, for files of agent/."""
    if sys.version_info >= (3, 11):
        import tomllib
    else:  # pragma: no cover - Python 3.10
        import tomli as tomllib
    doc = tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))
    ignores = doc["tool"]["ruff"]["lint"]["per-file-ignores"]
    return {f: set(codes) & SHAPE_RULES for f, codes in ignores.items() if f.startswith("agent/")}


def test_no_function_over_the_limit_outside_the_list():
    found = long_functions(ROOT)
    assert sorted(set(found) - LONG_FUNCTIONS) == [], "split these functions (over 60 lines)"
    mended = sorted(LONG_FUNCTIONS - set(found))
    assert mended == [], f"no longer over {MAX_LINES} lines: take them off LONG_FUNCTIONS and lower the maximum"


def test_the_lists_only_shrink():
    assert len(LONG_FUNCTIONS) <= LONG_FUNCTIONS_MAX
    allowed = shape_allow_list(ROOT)
    assert all(allowed.values()), "an agent/ entry of per-file-ignores that names no shape rule belongs elsewhere"
    assert len(allowed) <= SHAPE_ALLOW_MAX, f"the function-shape allow-list grew to {len(allowed)} files"


def test_the_guard_sees_a_long_function(tmp_path):
    (tmp_path / "agent").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "agent" / "big.py").write_text(f"def big():\n{body}\n\n\ndef small():\n    return 1\n")
    assert long_functions(tmp_path) == {"agent/big.py:big": MAX_LINES + 1}
