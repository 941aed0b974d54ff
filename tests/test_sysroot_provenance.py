"""The shipped device captures (agent/sysroots) say where every file came from, in the layout and with the
anonymisation scripts/capture-sysroot.sh writes; the README names every source."""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

from agent import sysroots as captures

ROOT = Path(__file__).resolve().parent.parent
SCRIPT = ROOT / "scripts/capture-sysroot.sh"
SCRIPT_RULE = re.search(r'^ANONYMISED="(.*)"$', SCRIPT.read_text(), re.M)
IDENTITY_FILES = {"hostname", "machine-id", "product_serial", "product_uuid", "board_serial", "serial-number"}


@pytest.mark.parametrize("name", captures.names())
def test_every_capture_says_where_its_files_came_from(name):
    root = captures.path(name)
    assert captures.provenance_problems(root) == [], name
    info = captures.provenance(root)
    assert SCRIPT_RULE and info["anonymised"] == [SCRIPT_RULE.group(1)]  # the script's rule, word for word
    assert not info["tool"][0].startswith(captures.SCRIPT_TOOL) or not info.get("hand-built")


def test_the_rule_catches_what_a_capture_fails_to_say(tmp_path):
    (tmp_path / ".captures").mkdir()
    info = tmp_path / ".captures/info.txt"
    base = "captured: unknown\nuname: x\nanonymised: y\n"
    cases = {
        "tool: assembled from public sources\nreal: proc/cpuinfo <- somewhere\nhand-built: none\n": "absent",
        "tool: assembled from public sources\nhand-built: all\n": "no `real:`",
        "tool: hand-built\nhand-built: every file\n": "captured: never",
        "tool: edge-agent capture-sysroot.sh 1\n": "says when it was read",
        "tool: my own script\n": "unknown tool",
    }
    for text, why in cases.items():
        info.write_text(base + text)
        assert any(why in p for p in captures.provenance_problems(tmp_path)), (text, why)
    info.write_text("tool: x\n")
    assert captures.provenance_problems(tmp_path) == [
        "info.txt lacks 'captured'",
        "info.txt lacks 'uname'",
        "info.txt lacks 'anonymised'",
    ]


@pytest.mark.parametrize("name", captures.names())
def test_serials_are_zeroed_and_no_identity_file_is_kept(name):
    root = captures.path(name)
    cpuinfo = root / "proc/cpuinfo"
    if cpuinfo.is_file():
        for line in cpuinfo.read_text(errors="replace").splitlines():
            key, _, value = line.partition(":")
            if key.strip() == "Serial":
                assert set(value.strip()) == {"0"}, f"{name}: Serial not zeroed ({value.strip()})"
    kept = {p.name for p in root.rglob("*") if p.is_file()} & IDENTITY_FILES
    assert not kept, f"{name}: identity files captured: {kept}"


def test_the_readme_names_every_capture_and_every_source_repository():
    readme = (captures.root() / "README.md").read_text()
    for name in captures.names():
        assert f"`{name}`" in readme, name
        for entry in captures.provenance(captures.path(name)).get("real", []):
            repo = re.search(r"github\.com/([\w.-]+/[\w.-]+)@", entry)
            if repo:
                assert repo.group(1) in readme, f"{name}: {repo.group(1)} is not in the README's source table"


def test_a_tree_without_info_has_no_provenance(tmp_path):
    assert captures.provenance(tmp_path) == {}
    (tmp_path / ".captures").mkdir()
    (tmp_path / ".captures/info.txt").write_text("tool: x\nreal: a <- b\nreal: c <- d\nno colon here\n")
    assert captures.provenance(tmp_path) == {"tool": ["x"], "real": ["a <- b", "c <- d"]}


def _script_code() -> str:
    return "\n".join(line for line in SCRIPT.read_text().splitlines() if not line.lstrip().startswith("#"))


def test_every_captured_file_is_one_the_script_writes():
    """The fixtures hold what capture-sysroot.sh writes: each file matches a path the script copies (its globs as
    written, comments left out) or a .captures/ file it writes."""
    code = _script_code()
    device = {p for p in re.findall(r"(/(?:proc|sys|etc|dev|usr|var)/[^\s\"'`;]+)", code)}
    own = {f"/.captures/{n}" for n in re.findall(r"\$ROOT/\.captures/([\w.]+)", code)}
    assert "/proc/cpuinfo" in device and "/.captures/sysctl.txt" in own and "/.captures/info.txt" in own
    for name in captures.names():
        root = captures.path(name)
        for f in sorted(p for p in root.rglob("*") if p.is_file()):
            rel = "/" + f.relative_to(root).as_posix()
            assert rel in own or any(fnmatch.fnmatchcase(rel, pat) for pat in device), f"{name}: {rel}"


def test_no_capture_keeps_a_sysctl_key_the_script_drops():
    dropped = re.search(r"grep -v -E '\^\(([^)]*)\)'", _script_code())
    assert dropped, "capture-sysroot.sh no longer filters sysctl -a"
    pattern = re.compile(rf"^({dropped.group(1)})", re.M)
    for name in captures.names():
        cap = captures.path(name) / ".captures/sysctl.txt"
        if cap.is_file():
            assert not pattern.search(cap.read_text()), name
