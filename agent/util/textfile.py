"""Reading the small text files the product is given (tokens, passwords, keys, YAML): bounded, decoded as UTF-8,
and every failure a domain error that names the file and the reason (never a UnicodeDecodeError or OSError)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_TEXT_BYTES = 1024 * 1024  # no config, token, key or model.yaml is bigger


def read_text(
    path: str | os.PathLike[str],
    what: str,
    error: type[Exception],
    *,
    max_bytes: int = MAX_TEXT_BYTES,
) -> str:
    """The file's text. `what` names it in the error (a config key, a flag, "model.yaml"); `error` is the domain
    error to raise (ConfigError, ModelError, ...): missing, unreadable, too big, not a regular file, not UTF-8."""
    p = Path(path)
    try:
        fd = os.open(p, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)  # a FIFO does not block the open
    except FileNotFoundError:
        raise error(f"{what}: file not found: {p}") from None
    except OSError as exc:
        raise error(f"{what}: cannot read {p}: {exc.strerror or exc}") from None
    try:
        if not stat.S_ISREG(os.fstat(fd).st_mode):
            raise error(f"{what}: {p} is not a regular file")
        with os.fdopen(fd, "rb", closefd=False) as fh:
            data = fh.read(max_bytes + 1)
    except FileNotFoundError:
        raise error(f"{what}: file not found: {p}") from None
    except IsADirectoryError:
        raise error(f"{what}: {p} is a directory, expected a file") from None
    except OSError as exc:
        raise error(f"{what}: cannot read {p}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    if len(data) > max_bytes:
        raise error(f"{what}: {p} is over {max_bytes} bytes; refusing to read it")
    return decode(data, f"{what}: {p}", error)


def decode(data: bytes, where: str, error: type[Exception]) -> str:
    """UTF-8 text of `data` (a leading BOM dropped), or `error` naming `where` and the first bad byte."""
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise error(
            f"{where}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); expected a UTF-8 text file"
        ) from None
