"""Unpack a stored package blob under packages/<sha>/ and check it (the child's side of the verify stage)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from agent.util.atomic import fsync_dir

if TYPE_CHECKING:
    from agent.artifacts.store import ContentStore

GZIP_MAGIC = b"\x1f\x8b"


def unpack(store: ContentStore, sha: str, packages_root: Path) -> Path:
    """packages/<sha>/ holding the package (extracted from a .tar.gz blob, or the bare model.onnx)."""
    final = packages_root / sha
    if final.is_dir():
        return final
    blob = Path(store.path(sha))
    tmp = packages_root / f".{sha}.{os.getpid()}.tmp"
    shutil.rmtree(tmp, ignore_errors=True)
    tmp.mkdir(parents=True)
    try:
        with open(blob, "rb") as f:
            magic = f.read(2)
        if magic == GZIP_MAGIC:
            from agent.package.load import extract_archive

            root = extract_archive(blob, tmp)
            if root != tmp:  # archive with one top-level directory: flatten
                for child in root.iterdir():
                    os.replace(child, tmp / child.name)
        else:
            shutil.copyfile(blob, tmp / "model.onnx")
        for p in tmp.rglob("*"):
            if p.is_file():
                with open(p, "rb") as f:
                    os.fsync(f.fileno())
        os.replace(tmp, final)
        fsync_dir(packages_root)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return final


def check_package(root: str) -> dict[str, Any]:
    """The child's side of verify(): load_package's checks (a generative package's: check_generative); where
    the model is and its digest (a generative package's: the digest of every file, as its decision records)."""
    from agent.generative.package import is_generative

    if is_generative(root):
        from agent.generative.package import load_generative
        from agent.generative.qualify import tree_sha256

        gen = load_generative(root)  # ModelError naming every problem
        return {"package_dir": str(root), "model_sha256": tree_sha256(gen.root), "model_path": str(gen.root)}
    from agent.package.load import load_package

    pkg = load_package(root)
    return {"package_dir": str(root), "model_sha256": pkg.sha256, "model_path": str(pkg.model_path)}


def check_loads(path: Path) -> None:
    """Refuse (ModelError) a package that would not load on a device: check_package's checks on a directory or
    bare .onnx, and on a .tar.gz unpacked into a temporary directory first (fleet push, rollouts)."""
    import tempfile

    from agent.package.load import extract_archive

    if path.is_file() and path.name.endswith((".tar.gz", ".tgz", ".tar")):
        with tempfile.TemporaryDirectory(prefix="edge-agent-pkg-") as tmp:
            check_package(str(extract_archive(path, Path(tmp))))
        return
    check_package(str(path))
