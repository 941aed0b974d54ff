"""The memory budget of `edge-agent package`'s sample inputs, and the readers that check a size before they inflate.

Every array a sample file declares (an .npy header, each .npz member's header, a .pb tensor's dims, a WAV's frame
count, an image's width x height from its PNG IHDR / JPEG SOF / BMP header) is counted against the budget before
a byte of it is allocated: a 1 MB .npz whose member declares 3x10^8 floats, or a 19 KB PNG of 12,500 x 12,500,
is refused with its file and size. An .npy header must also agree with the bytes that follow it, and a zip
member with its declared size, so a lying header is refused rather than read.

The budget (`--max-input-bytes`, default `default_budget()`): the decoded bytes of all inputs together; an image
counts 8 bytes a pixel (the decoder's 4-byte pixels and the RGB copy).
"""

from __future__ import annotations

import os
import re
import struct
import zipfile
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np

from agent.errors import ModelError

CEILING = 1 << 30  # never more than this, whatever the machine has
SHARE = 4  # the budget is this fraction of the memory free to the process: the checks and the run need the rest
MAX_MEMBERS = 1024  # .npz members (a sample names the model's inputs; a million tiny members is an attack)
IMAGE_BYTES_PER_PIXEL = 8
CHUNK = 4 << 20


@dataclass
class Budget:
    """What the inputs may still decode into; charge() refuses, naming the file, before anything is allocated."""

    limit: int
    used: int = 0

    def charge(self, what: str, nbytes: int) -> None:
        if self.used + nbytes > self.limit:
            left = self.limit - self.used
            raise ModelError(
                f"{what}: {nbytes} bytes decoded is over the input memory budget ({left} of {self.limit} bytes "
                "left; raise it with --max-input-bytes, or give a smaller sample)"
            )
        self.used += nbytes


def default_budget() -> int:
    """A quarter of the memory this process may still take (MemAvailable, the cgroup's memory.max, and
    RLIMIT_AS / RLIMIT_DATA less what it already holds), at most 1 GiB."""
    free = [_meminfo("MemAvailable")]
    free.append(_cgroup_free())
    try:
        import resource

        for which, used in ((resource.RLIMIT_AS, _status("VmSize")), (resource.RLIMIT_DATA, _status("VmData"))):
            soft = resource.getrlimit(which)[0]
            if soft != resource.RLIM_INFINITY:
                free.append(max(0, soft - (used or 0)))
    except (ImportError, OSError, ValueError):
        pass
    known = [f for f in free if f is not None]
    return min([CEILING] + [f // SHARE for f in known])


def _kib_field(path: str, name: str) -> int | None:
    try:
        text = Path(path).read_text()
    except OSError:
        return None
    m = re.search(rf"^{name}:\s+(\d+)\s*kB", text, re.M)
    return int(m.group(1)) * 1024 if m else None


def _meminfo(name: str) -> int | None:
    return _kib_field("/proc/meminfo", name)


def _status(name: str) -> int | None:
    return _kib_field("/proc/self/status", name)


def _cgroup_free() -> int | None:
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        current = int(Path("/sys/fs/cgroup/memory.current").read_text().strip())
    except (OSError, ValueError):
        return None
    return None if limit == "max" else max(0, int(limit) - current)


def read_npy(f: IO[bytes], stream_bytes: int, what: str, budget: Budget) -> np.ndarray:
    """One .npy stream (a file, or an .npz member of stream_bytes bytes): the header first, charged, then
    exactly the bytes it declares, read into one array."""
    fmt = np.lib.format
    try:
        version = fmt.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = fmt.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = fmt.read_array_header_2_0(f)
        else:
            raise ModelError(
                f"{what}: .npy format version {version} is not read here (1.0 or 2.0; np.save writes them)"
            )
    except ValueError as exc:
        raise ModelError(f"{what}: not an .npy array: {exc}") from None
    if dtype.hasobject:
        raise ModelError(f"{what}: object arrays are refused (they need pickle)")
    count = int(np.prod(shape, dtype=object))
    nbytes = count * dtype.itemsize
    budget.charge(f"{what} ({dtype}{list(shape)})", nbytes)
    held = stream_bytes - f.tell()
    if held != nbytes:  # exact: a zip member is then read to its end, where zipfile checks its CRC
        raise ModelError(f"{what}: its header declares {dtype}{list(shape)} = {nbytes} bytes, the data holds {held}")
    arr = np.empty(count, dtype=dtype)
    view = arr.data.cast("B")
    got = 0
    while got < nbytes:  # a chunk at a time: a zip member's readinto reads a whole request into a new buffer
        n = f.readinto(view[got : got + CHUNK])  # type: ignore[attr-defined]
        if not n:
            raise ModelError(f"{what}: the data ends after {got} of the {nbytes} bytes its header declares")
        got += n
    return arr.reshape(shape[::-1]).transpose() if fortran else arr.reshape(shape)


def read_npy_file(path: Path, budget: Budget) -> np.ndarray:
    with open(path, "rb") as f:
        return read_npy(f, os.fstat(f.fileno()).st_size, str(path), budget)


def read_npz(path: Path, budget: Budget) -> dict[str, np.ndarray]:
    """Each member's .npy header checked (against the budget, and against the member's declared uncompressed
    size) before it is read; a member whose stream is longer or shorter than its declared size fails zipfile's
    own size and CRC checks, which are refusals here too."""
    entries = _zip_entries(path)
    if entries > MAX_MEMBERS:
        raise ModelError(f"{path}: {entries} members (at most {MAX_MEMBERS} in a sample .npz)")
    out = {}
    try:
        with zipfile.ZipFile(path) as z:
            for info in z.infolist():
                what = f"{path} member {info.filename!r}"
                with z.open(info) as f:
                    arr = read_npy(f, info.file_size, what, budget)
                key = info.filename.removesuffix(".npy")
                out[key] = arr
    except (zipfile.BadZipFile, zlib.error) as exc:
        raise ModelError(f"{path}: not a valid .npz (zip): {exc}") from None
    return out


def _zip_entries(path: Path) -> int:
    """The member count the end-of-central-directory record declares, before zipfile builds one object each."""
    with open(path, "rb") as f:
        end = getattr(zipfile, "_EndRecData", None)
        rec = end(f) if end is not None else None
    if not rec:
        raise ModelError(f"{path}: not a valid .npz (no zip end record)")
    return int(rec[getattr(zipfile, "_ECD_ENTRIES_TOTAL", 4)])


def image_size(path: Path) -> tuple[int, int]:
    """(width, height) from a PNG IHDR, a JPEG SOFn or a BMP header: nothing decoded."""
    with open(path, "rb") as f:
        head = f.read(32)
        if head[:8] == b"\x89PNG\r\n\x1a\n" and head[12:16] == b"IHDR":
            w, h = struct.unpack(">II", head[16:24])
            return w, h
        if head[:2] == b"BM" and len(head) >= 26:
            w, h = struct.unpack("<ii", head[18:26])
            return abs(w), abs(h)
        if head[:2] == b"\xff\xd8":
            return _jpeg_size(f, path)
    raise ModelError(f"{path}: not a PNG, JPEG or BMP image")


def _jpeg_size(f: IO[bytes], path: Path) -> tuple[int, int]:
    f.seek(2)
    while True:
        marker = f.read(2)
        if len(marker) < 2 or marker[0] != 0xFF:
            raise ModelError(f"{path}: a JPEG without a frame header (SOF)")
        kind = marker[1]
        if kind in (0x01, 0xFF) or 0xD0 <= kind <= 0xD7:  # no length: skip (fill bytes, TEM, RSTn)
            if kind == 0xFF:
                f.seek(-1, os.SEEK_CUR)
            continue
        (length,) = struct.unpack(">H", f.read(2) or b"\0\0")
        if 0xC0 <= kind <= 0xCF and kind not in (0xC4, 0xC8, 0xCC):
            seg = f.read(5)
            if len(seg) < 5:
                break
            h, w = struct.unpack(">HH", seg[1:5])
            return w, h
        if length < 2:
            break
        f.seek(length - 2, os.SEEK_CUR)
    raise ModelError(f"{path}: a JPEG without a frame header (SOF)")


PB_EXPANSION = 8  # a .pb's typed fields decode to at most 8 bytes a file byte (a 1-byte varint into an int64)


def charge_pb(path: Path, budget: Budget) -> None:
    size = path.stat().st_size
    budget.charge(f"{path} ({size} bytes of TensorProto, up to {PB_EXPANSION}x decoded)", size * PB_EXPANSION)


def charge_wav(path: Path, frames: int, channels: int, width: int, budget: Budget) -> None:
    """The frames the header declares, at most the ones the file can hold: float32, and the mono mean."""
    held = path.stat().st_size // max(1, width * channels)
    n = min(frames, held) * channels
    budget.charge(f"{path} ({min(frames, held)} frames x {channels} channels)", n * width + n * 4 + n // channels * 4)


def charge_image(path: Path, budget: Budget) -> None:
    w, h = image_size(path)
    budget.charge(f"{path} ({w}x{h} pixels)", w * h * IMAGE_BYTES_PER_PIXEL)
