"""File-tree helpers: a directory of given files (a fake sysroot, a package's extra files)."""

from __future__ import annotations

from pathlib import Path


def write_tree(root: Path, files: dict[str, bytes] | dict[str, str]) -> Path:
    """Write each relative path's content (bytes, or text as UTF-8) under root; returns root."""
    for rel, content in files.items():
        p = root / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(content if isinstance(content, bytes) else content.encode())
    return root
