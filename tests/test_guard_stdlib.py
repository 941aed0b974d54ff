"""edge-agent-guard imports only the standard library and never `agent` (a broken release cannot break the code
that rolls it back), and its links flip atomically: checked in a fresh interpreter, and on a real directory."""

from __future__ import annotations

import ast
import os
import subprocess
import sys
from pathlib import Path

from agent_guard import links

ROOT = Path(__file__).resolve().parents[1]


def test_the_guard_imports_only_the_standard_library():
    allowed = set(sys.stdlib_module_names) | {"agent_guard", "__future__"}
    for path in sorted((ROOT / "agent_guard").glob("*.py")) + [ROOT / "scripts" / "edge-agent-guard"]:
        tree = ast.parse(path.read_text(), str(path))
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                names = [node.module]
            for name in names:
                assert name.split(".")[0] in allowed, f"{path.name} imports {name}"


def test_the_guard_runs_without_agent_on_the_path(tmp_path):
    # a fresh interpreter with no site-packages (-S -I): the launcher finds agent_guard beside it, nothing else
    (tmp_path / "releases" / "1.0").mkdir(parents=True)
    links.set_link(tmp_path, links.CURRENT, "1.0")
    code = (
        "import runpy, sys; sys.argv = ['edge-agent-guard', 'status', '--root', sys.argv[1], '--json']; "
        f"runpy.run_path({str(ROOT / 'scripts' / 'edge-agent-guard')!r}, run_name='__main__')"
    )
    r = subprocess.run([sys.executable, "-S", "-I", "-c", code, str(tmp_path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stderr
    assert '"current": "1.0"' in r.stdout
    probe = f"import sys; sys.path.insert(0, {str(ROOT)!r}); import agent_guard.__main__; print('agent' in sys.modules)"
    r = subprocess.run([sys.executable, "-S", "-I", "-c", probe], capture_output=True, text=True)
    assert r.stdout.strip() == "False", (r.stdout, r.stderr)


def test_flip_keeps_previous_and_flip_back_restores(tmp_path):
    for v in ("1", "2"):
        (tmp_path / "releases" / v).mkdir(parents=True)
    assert links.flip(tmp_path, "1") is None
    assert (links.target(tmp_path, "current"), links.target(tmp_path, "previous")) == ("1", None)
    assert links.flip(tmp_path, "2") == "1"
    assert (links.target(tmp_path, "current"), links.target(tmp_path, "previous")) == ("2", "1")
    assert os.readlink(tmp_path / "current") == "releases/2"  # relative: the root can move
    links.flip_back(tmp_path, "2", "1")
    assert (links.target(tmp_path, "current"), links.target(tmp_path, "previous")) == ("1", "2")
    assert not list(tmp_path.glob(".*.tmp"))


def test_tries_and_bad_marks(tmp_path):
    assert links.tries(tmp_path, "2") == 0
    assert links.add_try(tmp_path, "2", "no READY=1") == 1
    assert links.add_try(tmp_path, "2", "no READY=1") == 2
    assert not links.is_bad(tmp_path, "2")
    links.mark_bad(tmp_path, "2", "twice")
    assert links.is_bad(tmp_path, "2")
    links.tries_clear(tmp_path, "2")
    assert links.tries(tmp_path, "2") == 0


def test_the_agent_signs_the_guards_reports_with_the_device_key(tmp_path):
    from agent.artifacts.keys import device_key
    from agent.release.reports import sign_reports
    from agent.transport.signing import verify_doc

    links.write_json(tmp_path / "guard" / "reports" / "1-2.0.json", {"version": "2.0", "result": "rolled-back"})
    (signed,) = sign_reports(tmp_path, tmp_path / "state")
    assert signed["signed"] is True and signed["result"] == "rolled-back"
    assert verify_doc(signed, device_key(tmp_path / "state").public_key()) == "verified"
    assert sign_reports(tmp_path, tmp_path / "state") == [signed]  # signed once
