"""The docs name only modules and files that exist (docs/architecture.md once cited a module that did not)."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
DOCS = [*sorted((ROOT / "docs").glob("*.md")), ROOT / "README.md", ROOT / "targets" / "README.md"]
SUBPACKAGES = "lifecycle|serving|qualify|package|isolate|sim|trial|sources|artifacts|transport|fleet|providers|hardware|conformance|cli|util|services"


def _is_module(dotted: str) -> bool:
    """agent.a.b.name: each part a subpackage or module, then at most one name the module defines."""
    here = ROOT / "agent"
    parts = dotted.split(".")[1:]
    for i, part in enumerate(parts):
        if (here / part / "__init__.py").is_file():
            here = here / part
        elif (here / f"{part}.py").is_file():
            rest = parts[i + 1 :]
            text = (here / f"{part}.py").read_text(encoding="utf-8")
            return not rest or re.search(rf"\b{re.escape(rest[0])}\b", text) is not None
        else:  # a name the package's __init__ defines, or nothing
            init = here / "__init__.py"
            return init.is_file() and re.search(rf"\b{re.escape(part)}\b", init.read_text(encoding="utf-8")) is not None
    return True


def missing_references(text: str) -> list[str]:
    bad = [p for p in re.findall(r"\bagent(?:/\w+)+\.py\b", text) if not (ROOT / p).is_file()]
    bad += [m for m in re.findall(r"`(agent(?:\.\w+)+)", text) if m != "agent.yaml" and not _is_module(m)]
    bad += [
        p for p in re.findall(rf"(?<![\w/])(?:{SUBPACKAGES})/\w+\.py\b", text) if not (ROOT / "agent" / p).is_file()
    ]
    return bad


def test_the_checker_sees_a_missing_module():
    found = missing_references("see `agent.lifecycle.store` and agent/serving/nothing.py and qualify/gone.py")
    assert sorted(found) == ["agent.lifecycle.store", "agent/serving/nothing.py", "qualify/gone.py"]
    assert missing_references("`agent.lifecycle.slots.ModelSlots` in agent/lifecycle/slots.py") == []


def test_docs_name_only_what_exists():
    bad = {doc.name: missing_references(doc.read_text(encoding="utf-8")) for doc in DOCS}
    assert {k: v for k, v in bad.items() if v} == {}


def test_every_module_of_the_system_lane_exists():
    """tests/lanes.py names modules by file: a renamed module must not drop out of its lane unnoticed."""
    from lanes import SYSTEM

    here = Path(__file__).parent
    missing = sorted(m for m in SYSTEM if not (here / f"{m}.py").is_file())
    assert not missing, missing
