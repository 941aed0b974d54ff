"""System shared memory extension (Triton's): regions a client created (shm_open + ftruncate) registered by name,
key, offset and size; inputs read in place from a region and outputs written to one, with no copy through a socket.

Bounds: every request's offset and size are checked against the registered window and against the region's real
size at that moment (its end, by lseek), so a client that shrank its region gets a 400, not a SIGBUS. The server
never frees what it did not create: unregister closes the server's own mapping and descriptor, never shm_unlink.
Keys are POSIX shm names ("/name", one component), opened under /dev/shm. Outputs the runtime can write in place
(static shape and dtype, no overlap with an input's bytes) go straight into their window (place()).
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from agent.serving.errors import AlreadyExists, BadRequest, NotFound

SHM_DIR = "/dev/shm"
MAX_REGIONS = 256


class ShmSlot(NamedTuple):
    """An input that lies in a registered region (checked when the request runs)."""

    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    elements: int
    region: str
    offset: int
    size: int


class ShmOut(NamedTuple):
    """Where an output is to be written."""

    region: str
    offset: int
    size: int


def _int(params: dict[str, Any], key: str, where: str, default: int | None = None) -> int:
    raw = params.get(key, default)
    if isinstance(raw, bool) or not isinstance(raw, int) or raw < 0:
        raise BadRequest(f"{where}: {key} must be a non-negative integer")
    return int(raw)


def input_slot(name: str, dtype: np.dtype, shape: tuple[int, ...], count: int, params: dict[str, Any]) -> ShmSlot:
    where = f"input {name!r}"
    region = params.get("shared_memory_region")
    if not isinstance(region, str) or not region:
        raise BadRequest(f"{where}: shared_memory_region must be a region name")
    size = _int(params, "shared_memory_byte_size", where)
    offset = _int(params, "shared_memory_offset", where, 0)
    if dtype.kind == "O":
        raise BadRequest(f"{where}: BYTES inputs in shared memory are not supported; send them in the request")
    if size != count * dtype.itemsize:
        raise BadRequest(
            f"{where}: shared_memory_byte_size {size} != {count} elements x {dtype.itemsize} bytes for shape "
            f"{list(shape)}"
        )
    return ShmSlot(name, dtype, shape, count, region, offset, size)


def output_target(name: str, params: dict[str, Any]) -> ShmOut | None:
    region = params.get("shared_memory_region")
    if region is None:
        return None
    where = f"output {name!r}"
    if not isinstance(region, str) or not region:
        raise BadRequest(f"{where}: shared_memory_region must be a region name")
    return ShmOut(
        region, _int(params, "shared_memory_offset", where, 0), _int(params, "shared_memory_byte_size", where)
    )


def _fits(name: str, nbytes: int, target: ShmOut) -> None:
    if nbytes > target.size:
        raise BadRequest(f"output {name!r} is {nbytes} bytes, over its shared_memory_byte_size of {target.size}")


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    mm: mmap.mmap
    file: tuple[int, int]  # (st_dev, st_ino): two registrations of one memory object alias each other

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


class SharedMemory:
    """The registered regions (thread-safe)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._regions: dict[str, _Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        if not isinstance(name, str) or not name or len(name) > 256:
            raise BadRequest("region name must be a non-empty string of at most 256 characters")
        if (
            not isinstance(key, str)
            or not key.startswith("/")
            or "/" in key[1:]
            or key in ("/", "/.", "/..")
            or "\0" in key
        ):
            raise BadRequest(f"key must be a POSIX shared memory name like '/name', got {str(key)[:80]!r}")
        if (
            isinstance(offset, bool)
            or isinstance(byte_size, bool)
            or not isinstance(offset, int)
            or not isinstance(byte_size, int)
        ):
            raise BadRequest("offset and byte_size must be integers")
        if offset < 0 or byte_size <= 0:
            raise BadRequest("offset must be >= 0 and byte_size > 0")
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region {name!r} is already registered; unregister it first")
            if len(self._regions) >= MAX_REGIONS:
                raise BadRequest(f"at most {MAX_REGIONS} shared memory regions may be registered")
        path = os.path.join(SHM_DIR, key[1:])
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise BadRequest(f"cannot open shared memory {key!r}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            real = st.st_size
            if offset + byte_size > real:
                raise BadRequest(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} exceeds the real size {real} of {key!r}"
                )
            mm = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        region = _Region(name, key, offset, byte_size, fd, mm, (st.st_dev, st.st_ino))
        with self._lock:
            if name in self._regions:  # registered meanwhile
                mm.close()
                os.close(fd)
                raise AlreadyExists(f"shared memory region {name!r} is already registered; unregister it first")
            self._regions[name] = region

    def status(self, name: str = "") -> list[dict[str, Any]]:
        with self._lock:
            if name:
                if name not in self._regions:
                    raise NotFound(f"no shared memory region {name!r} is registered")
                return [self._regions[name].status()]
            return [r.status() for r in self._regions.values()]

    def unregister(self, name: str = "") -> None:
        """Forget one region (every one when name is empty): close the server's mapping, never the client's memory."""
        with self._lock:
            if name:
                region = self._regions.pop(name, None)
                gone = [region] if region is not None else []
            else:
                gone, self._regions = list(self._regions.values()), {}
        for region in gone:
            os.close(region.fd)
            try:
                region.mm.close()
            except BufferError:  # a request still reads a view of it: the mapping goes with the last view
                pass

    def close(self) -> None:
        self.unregister("")

    def _window(self, region_name: str, offset: int, size: int, what: str) -> memoryview:
        return self._locate(region_name, offset, size, what)[0]

    def _locate(self, region_name: str, offset: int, size: int, what: str) -> tuple[memoryview, _Region, int]:
        """The window (bounds-checked against the registration and the region's real size now), its region and
        its start in the memory object."""
        with self._lock:
            region = self._regions.get(region_name)
        if region is None:
            raise BadRequest(f"{what}: shared memory region {region_name!r} is not registered")
        if offset + size > region.byte_size:
            raise BadRequest(
                f"{what}: offset {offset} + {size} bytes run past region {region_name!r} of {region.byte_size} bytes"
            )
        try:
            real = os.lseek(region.fd, 0, os.SEEK_END)  # the size now; 4x cheaper than fstat (the offset is unused)
        except OSError as exc:
            raise BadRequest(f"{what}: region {region_name!r} is gone: {exc.strerror}") from None
        start = region.offset + offset
        if start + size > real:
            raise BadRequest(
                f"{what}: region {region_name!r} ({region.key}) is now {real} bytes, too small for bytes "
                f"{start}..{start + size}"
            )
        try:
            return memoryview(region.mm)[start : start + size], region, start
        except ValueError:
            raise BadRequest(f"{what}: shared memory region {region_name!r} was unregistered") from None

    def read(self, slot: ShmSlot) -> np.ndarray:
        """The input as an array over the region's memory (no copy)."""
        view = self._window(slot.region, slot.offset, slot.size, f"input {slot.name!r}")
        wire = slot.dtype.newbyteorder("<") if slot.dtype.itemsize > 1 else slot.dtype
        arr = np.frombuffer(view, dtype=wire, count=slot.elements)
        return (arr.view(np.uint8) != 0 if slot.dtype == np.bool_ else arr).reshape(slot.shape)

    def write(self, name: str, arr: np.ndarray, target: ShmOut) -> int:
        """Copy an output into its region; BadRequest when it does not fit the space the request gave."""
        if arr.dtype.kind == "O":
            raise BadRequest(f"output {name!r}: BYTES outputs in shared memory are not supported")
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype)
        _fits(name, data.nbytes, target)
        view = self._window(target.region, target.offset, data.nbytes, f"output {name!r}")
        view[:] = data.data.cast("B")
        return int(data.nbytes)

    def place(
        self, name: str, dtype: np.dtype, shape: tuple[int, ...], target: ShmOut, inputs: list[ShmSlot]
    ) -> np.ndarray | None:
        """The output's window as a little-endian array for the runtime to write into during the run (no copy
        after it), bounds-checked as write() checks; None when it is empty or overlaps a shared-memory input
        of the request (its memory object and bytes, however registered): then it is written after the run."""
        nbytes = math.prod(shape) * dtype.itemsize
        _fits(name, nbytes, target)
        if not nbytes:
            return None
        view, region, start = self._locate(target.region, target.offset, nbytes, f"output {name!r}")
        for slot in inputs:
            with self._lock:
                other = self._regions.get(slot.region)
            if other is None:
                return None
            at = other.offset + slot.offset
            if other.file == region.file and at < start + nbytes and start < at + slot.size:
                return None
        wire = dtype.newbyteorder("<") if dtype.itemsize > 1 else dtype
        return np.frombuffer(view, dtype=wire).reshape(shape)

    # ---- the extension's endpoints (DataPlane hooks) -------------------------------------------------------
    def http(self, path: str, doc: dict[str, Any]) -> Any:
        parts = path.strip("/").split("/")  # v2 systemsharedmemory [region NAME] status|register|unregister
        action = parts[-1]
        name = parts[3] if len(parts) == 5 and parts[2] == "region" else ""
        if len(parts) not in (3, 5) or (len(parts) == 5 and parts[2] != "region"):
            raise NotFound(f"no such endpoint: {path}")
        return self.call(action, {**doc, "name": name})

    def call(self, method: str, doc: dict[str, Any]) -> Any:
        name = doc.get("name") or ""
        if method == "status":
            regions = self.status(name)
            return {"regions": {r["name"]: r for r in regions}} if doc.get("_grpc") else regions
        if method == "register":
            self.register(name, doc.get("key"), doc.get("offset", 0), doc.get("byte_size"))  # type: ignore[arg-type]
            return None
        if method == "unregister":
            self.unregister(name)
            return None
        raise NotFound(f"no such shared memory action: {method[:40]}")
