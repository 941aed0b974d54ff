"""Class labels of a model package for the classification extension: `labels.txt` beside model.onnx, one label per
line (Triton's label_filename format), at most MAX_BYTES; anything unreadable means no labels (classification then
answers "value:index"), never a failed deployment."""

from __future__ import annotations

from pathlib import Path

FILENAME = "labels.txt"
MAX_BYTES = 1 << 20


def read_labels(package_dir: str | Path | None) -> list[str] | None:
    if not package_dir:
        return None
    path = Path(package_dir) / FILENAME
    try:
        if not path.is_file() or path.stat().st_size > MAX_BYTES:
            return None
        text = path.read_bytes().decode("utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    return [line.strip() for line in text.splitlines()]  # line i names class i
