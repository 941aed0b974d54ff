"""Package archives on a Python without tarfile's extraction filters (< 3.11.4: Debian bookworm's 3.11.2, so
Raspberry Pi OS): the same entries are refused, and nothing beyond plain rwx modes is extracted."""

from __future__ import annotations

import io
import stat
import tarfile

import pytest

from agent.errors import ModelError
from agent.package.load import extract_archive


def _tar(path, entries):
    with tarfile.open(path, "w:gz") as tar:
        for name, mode, data in entries:
            info = tarfile.TarInfo(name)
            info.size, info.mode = len(data), mode
            tar.addfile(info, io.BytesIO(data))
    return path


@pytest.fixture
def no_filters(monkeypatch):
    """tarfile as in Python 3.11.2: no data_filter, and extractall() takes no `filter` argument."""
    monkeypatch.delattr(tarfile, "data_filter", raising=False)
    real = tarfile.TarFile.extractall

    def extractall(self, path=".", members=None, *, numeric_owner=False, **kw):
        if kw:
            raise TypeError(f"TarFile.extractall() got an unexpected keyword argument {next(iter(kw))!r}")
        return real(self, path, members, numeric_owner=numeric_owner, filter="fully_trusted")

    monkeypatch.setattr(tarfile.TarFile, "extractall", extractall)


def test_extracts_with_plain_modes(tmp_path, no_filters):
    arc = _tar(tmp_path / "p.tar.gz", [("pkg/model.onnx", 0o6777, b"x"), ("pkg/model.yaml", 0o644, b"name: p\n")])
    root = extract_archive(arc, tmp_path / "out")
    mode = stat.S_IMODE((root / "model.onnx").stat().st_mode)
    assert root.name == "pkg" and mode & (stat.S_ISUID | stat.S_ISGID | stat.S_IWOTH | stat.S_IWGRP) == 0


@pytest.mark.parametrize("name", ["../escape.onnx", "/abs.onnx"])
def test_still_refuses_entries_leaving_the_package(tmp_path, no_filters, name):
    arc = _tar(tmp_path / "bad.tar.gz", [(name, 0o644, b"x")])
    with pytest.raises(ModelError, match="escapes the package"):
        extract_archive(arc, tmp_path / "out")
    assert not (tmp_path / "escape.onnx").exists()
