"""The one way a file's sha256 is computed: streamed in 1 MiB blocks, so memory stays flat whatever the size."""

from __future__ import annotations

import hashlib
import os

BLOCK = 1 << 20


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of the file at `path`."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(BLOCK):
            h.update(block)
    return h.hexdigest()
