"""What an unpacked package held when it was verified, and the start-up check that it still holds it.

packages/<sha>.files.json records, per file: size, sha256, mtime_ns and ctime_ns. The cheap check compares
size and both times (any write or metadata change moves ctime, which user space cannot set back); a file that
differs, or a package without a record, is re-hashed in full ("in doubt"). Problems name the file.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from agent.util.atomic import atomic_write_json, read_json
from agent.util.hashing import sha256_file

FORMAT = 1


def record_path(package_dir: str | os.PathLike[str]) -> Path:
    p = Path(package_dir)
    return p.parent / f"{p.name}.files.json"


def _files(root: Path) -> list[Path]:
    return sorted(p for p in root.rglob("*") if p.is_file() and not p.is_symlink())


def record(package_dir: str | os.PathLike[str]) -> dict[str, Any]:
    """Hash every file of a freshly verified package and store the record beside it."""
    root = Path(package_dir)
    files = {}
    for p in _files(root):
        st = p.stat()
        files[p.relative_to(root).as_posix()] = [st.st_size, sha256_file(p), st.st_mtime_ns, st.st_ctime_ns]
    doc = {"format": FORMAT, "files": files}
    atomic_write_json(record_path(root), doc, mode=0o600)
    return doc


def check(
    package_dir: str | os.PathLike[str],
    model_sha256: str | None = None,
    model_path: str | None = None,
    *,
    restamp: bool = True,
) -> list[str]:
    """Problems with an unpacked package (empty: it holds what was verified). Without a record, the model file
    is re-hashed against `model_sha256`. restamp: write the record again when only the file times moved (a
    copy) or none existed; False for read-only checks."""
    root = Path(package_dir)
    if not root.is_dir():
        return [f"{root}: unpacked package is missing"]
    try:
        doc = read_json(record_path(root))
    except (OSError, ValueError) as exc:
        doc = None
        problems = [f"{record_path(root)}: unreadable ({exc}); re-hashing"]
    else:
        problems = []
    if not isinstance(doc, dict) or doc.get("format") != FORMAT or not isinstance(doc.get("files"), dict):
        return problems + _check_model_only(root, model_sha256, model_path, restamp)
    refreshed = False
    for rel, (size, digest, mtime, ctime) in doc["files"].items():
        p = root / rel
        try:
            st = p.stat()
        except FileNotFoundError:
            problems.append(f"{p}: missing")
            continue
        if st.st_size != size:
            problems.append(f"{p}: {st.st_size} bytes, {size} when verified (truncated or replaced)")
            continue
        if (st.st_mtime_ns, st.st_ctime_ns) == (mtime, ctime):
            continue
        if sha256_file(p) != digest:  # in doubt: the full re-hash decides
            problems.append(f"{p}: content differs from its verified sha256 {digest[:12]} (replaced)")
            continue
        doc["files"][rel] = [size, digest, st.st_mtime_ns, st.st_ctime_ns]  # same bytes (a copy): re-stamp
        refreshed = True
    if refreshed and not problems and restamp:
        try:
            atomic_write_json(record_path(root), doc, mode=0o600)
        except OSError:
            pass  # full disk: checked in full again next time
    return problems


def _check_model_only(root: Path, model_sha256: str | None, model_path: str | None, restamp: bool) -> list[str]:
    model = Path(model_path) if model_path else root / "model.onnx"
    if not model.is_file():
        return [f"{model}: missing"]
    if model_sha256 and sha256_file(model) != model_sha256:
        return [f"{model}: content differs from its verified sha256 {model_sha256[:12]} (replaced)"]
    if restamp:
        try:
            record(root)
        except OSError:
            pass
    return []
