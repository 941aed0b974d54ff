"""Reproducible package tarballs whose gzip stream chunks: the recipe of a `tar.gz` package.

A gzip stream cannot be chunked after the fact: one changed byte changes every compressed byte after it. So the
package is cut before compression, at content-defined points of the tar (agent.artifacts.recipe.cut_points on
each member's data: ONNX tensor boundaries + FastCDC), and the deflate stream is reset (Z_FULL_FLUSH: byte
aligned, no history) at every cut. Each piece's compressed bytes then depend only on its own content, and the
recipe lists the compressed pieces: a new version of a package reuses every piece whose content did not change.
The result is an ordinary single-member gzip file.
"""

from __future__ import annotations

import hashlib
import mmap
import os
import struct
import tarfile
import tempfile
import zlib
from pathlib import Path
from typing import IO, Any

from agent.artifacts.recipe import CHUNKER, cut_points
from agent.errors import ModelError

LEVEL = 6


def _tar(directory: Path, out: IO[bytes]) -> list[tuple[int, int, str]]:
    """Write the reproducible tar (sorted, mtime 0, no owners); returns (data offset, size, name) per file."""
    files = []
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for path in sorted(directory.rglob("*")):
            rel = path.relative_to(directory).as_posix()
            if path.is_symlink():
                raise ModelError(f"package {directory} contains a symlink ({rel}); copy the file instead")
            info = tar.gettarinfo(str(path), arcname=rel)
            info.mtime, info.uid, info.gid, info.uname, info.gname = 0, 0, 0, "", ""
            info.mode = 0o755 if path.is_dir() else 0o644
            if path.is_file():
                with open(path, "rb") as f:
                    tar.addfile(info, f)
                files.append((out.tell() - _padded(info.size), info.size, rel))
            else:
                tar.addfile(info)
    return files


def _padded(n: int) -> int:
    return -(-n // tarfile.BLOCKSIZE) * tarfile.BLOCKSIZE


def _cuts(mm: mmap.mmap, files: list[tuple[int, int, str]]) -> list[int]:
    cuts = {0}
    for start, size, name in files:
        cuts.update((start, start + size))
        if size:
            view = memoryview(mm)[start : start + size]
            try:
                onnx_file = name.endswith(".onnx")  # tensor cuts in ONNX files; other files: FastCDC alone
                points = cut_points(view, CHUNKER if onnx_file else "fastcdc-v1")
                cuts.update(start + c for c in points)
            finally:
                view.release()
    return sorted(c for c in cuts if c < len(mm))


def write_targz(directory: str | os.PathLike[str], out: str | os.PathLike[str]) -> dict[str, Any]:
    """Write directory as a gzip'd tar to `out`; returns its recipe (the compressed pieces, in order)."""
    directory = Path(directory)
    with tempfile.TemporaryFile(dir=Path(out).parent) as raw:
        files = _tar(directory, raw)
        raw.flush()
        with mmap.mmap(raw.fileno(), 0, access=mmap.ACCESS_READ) as mm, open(out, "wb") as dst:
            cuts = _cuts(mm, files) + [len(mm)]
            header = b"\x1f\x8b\x08\x00" + struct.pack("<I", 0) + b"\x00\xff"  # deflate, mtime 0, OS unknown
            comp = zlib.compressobj(LEVEL, zlib.DEFLATED, -15)
            crc, pieces = 0, []
            for n, (a, b) in enumerate(zip(cuts, cuts[1:])):
                crc = zlib.crc32(mm[a:b], crc)
                piece = comp.compress(mm[a:b]) + comp.flush(zlib.Z_FULL_FLUSH)
                pieces.append(header + piece if n == 0 else piece)
            pieces.append(comp.flush(zlib.Z_FINISH) + struct.pack("<II", crc, len(mm) & 0xFFFFFFFF))
            chunks = []
            for piece in pieces:
                if piece:
                    dst.write(piece)
                    chunks.append([hashlib.sha256(piece).hexdigest(), len(piece)])
    return {"chunker": CHUNKER, "chunks": chunks}
