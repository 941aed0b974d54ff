"""The shipped device captures (agent/sysroots) say where every file came from, in the layout and with the
anonymisation scripts/capture-sysroot.sh writes; the README names every source."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from agent import sysroots as captures

ROOT = Path(__file__).resolve().parent.parent
SCRIPT_RULE = re.search(r'^ANONYMISED="(.*)"$', (ROOT / "scripts/capture-sysroot.sh").read_text(), re.M)
KEYS = {"captured", "uname", "tool", "anonymised"}
IDENTITY_FILES = {"hostname", "machine-id", "product_serial", "product_uuid", "board_serial", "serial-number"}


@pytest.mark.parametrize("name", captures.names())
def test_every_capture_says_where_its_files_came_from(name):
    root = captures.path(name)
    info = captures.provenance(root)
    assert KEYS <= set(info), f"{name}: .captures/info.txt lacks {KEYS - set(info)}"
    assert SCRIPT_RULE and info["anonymised"] == [SCRIPT_RULE.group(1)]  # the script's rule, word for word
    sourced = info.get("real", []) + info.get("transcribed", [])
    for entry in sourced:
        rel, arrow, source = entry.partition(" <- ")
        assert arrow and source, f"{name}: {entry!r} names no source"
        assert (root / rel).is_file(), f"{name}: {rel} is named in info.txt but absent"
    assert info.get("hand-built"), f"{name}: say which files are hand-built (even 'none')"
    if sourced:
        assert info["tool"][0].startswith("assembled from public sources")
    else:
        assert info["tool"][0].startswith("hand-built") and info["captured"] == ["never"]


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
