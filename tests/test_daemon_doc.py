"""docs/daemon.md stays true to the code: the transition and recovery tables are the generated ones, and every
environment knob, state_dir entry and reloadable key the code knows is documented."""

from __future__ import annotations

import re
from pathlib import Path

from agent.config import RELOADABLE
from agent.lifecycle import recovery, table

DOC = Path(__file__).resolve().parent.parent / "docs" / "daemon.md"


def _between(text: str, name: str) -> str:
    m = re.search(rf"<!-- {name}:begin -->\n(.*?)<!-- {name}:end -->", text, re.S)
    assert m, f"docs/daemon.md lacks the {name} markers"
    return m.group(1)


def test_the_transition_table_is_generated_from_the_code():
    text = DOC.read_text()
    assert _between(text, "transitions") == table.markdown()
    assert _parse(table.markdown()) == {(s.value, e.value): t.value for (s, e), t in table.TRANSITIONS.items()}


def _parse(md: str) -> dict:
    """Read the rendered table back: every (state, event) -> state it shows."""
    out = {}
    for line in md.splitlines()[2:]:
        state, cells = (c.strip() for c in line.strip("|").split("|"))
        for group in cells.split("; "):
            events, target = group.split(" -> ")
            for ev in events.split(", "):
                out[(state.strip("`"), ev.strip("`"))] = target.strip("`")
    return out


def test_the_recovery_table_is_generated_from_the_code():
    assert _between(DOC.read_text(), "recovery") == recovery.markdown()
    assert recovery.markdown().count("\n| `") == len(recovery.RESUME)


def test_knobs_layout_and_reloadable_keys_are_documented():
    text = DOC.read_text()
    from agent.cli import daemon

    for var in set(re.findall(r"EDGE_AGENT_[A-Z_]+", daemon.__doc__)) | {"EDGE_AGENT_TEST_CRASH_AT"}:
        assert f"`{var}`" in text, var
    for entry in (
        "blobs/",
        "staging/",
        "deployments/",
        "models/",
        "packages/",
        "decisions/",
        "tmp/",
        "control/",
        "cache/",
        "agent.lock",
        "status.json",
    ):
        assert entry in text, entry
    for key in RELOADABLE:
        assert f"`{key}`" in text, key
