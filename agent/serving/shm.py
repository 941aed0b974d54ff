"""System shared memory extension (Triton's): regions a client created (shm_open + ftruncate) registered by name,
key, offset and size; inputs read from a region and outputs written to one, with no copy through a socket.

Bounds: every request's offset and size are checked against the registered window. By default the server never
maps a region: an input is read with preadv straight into the array the model gets, an output written with
pwrite, so a client that shrinks (ftruncate) its region, even while a request reads it, makes that request's
read come back short, a 400 naming the region's size now, never a SIGBUS that stops the daemon (a live mapping
faults on a page past the file's end). `in_place=True` (config `serving.shm_in_place`) maps each region instead:
inputs are read in place and outputs the runtime can write in place (static shape and dtype, no overlap with an
input's bytes) go straight into their window (place()); the region's real size is checked (lseek to its end)
before each access, but a truncation between that check and the access faults, so only trusted clients.
The server never frees what it did not create: unregister closes the server's own descriptor (and mapping),
never shm_unlink. Keys are POSIX shm names ("/name", one component), opened under /dev/shm.
"""

from __future__ import annotations

import math
import mmap
import os
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, NamedTuple

import numpy as np

from agent.serving.errors import AlreadyExists, InvalidInput, NotFound

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
        raise InvalidInput(f"{where}: {key} must be a non-negative integer")
    return int(raw)


def input_slot(name: str, dtype: np.dtype, shape: tuple[int, ...], count: int, params: dict[str, Any]) -> ShmSlot:
    where = f"input {name!r}"
    region = params.get("shared_memory_region")
    if not isinstance(region, str) or not region:
        raise InvalidInput(f"{where}: shared_memory_region must be a region name")
    size = _int(params, "shared_memory_byte_size", where)
    offset = _int(params, "shared_memory_offset", where, 0)
    if dtype.kind == "O":
        raise InvalidInput(f"{where}: BYTES inputs in shared memory are not supported; send them in the request")
    if size != count * dtype.itemsize:
        raise InvalidInput(
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
        raise InvalidInput(f"{where}: shared_memory_region must be a region name")
    return ShmOut(
        region, _int(params, "shared_memory_offset", where, 0), _int(params, "shared_memory_byte_size", where)
    )


def _fits(name: str, nbytes: int, target: ShmOut) -> None:
    if nbytes > target.size:
        raise InvalidInput(f"output {name!r} is {nbytes} bytes, over its shared_memory_byte_size of {target.size}")


@dataclass
class _Region:
    name: str
    key: str
    offset: int
    byte_size: int
    fd: int
    mm: mmap.mmap | None  # only with in_place
    file: tuple[int, int]  # (st_dev, st_ino): two registrations of one memory object alias each other
    users: int = 0  # requests using fd now (under SharedMemory._lock): an unregister leaves it to the last one
    gone: bool = False  # unregistered: closed when users drops to 0 (a closed fd number may be reused at once)

    def status(self) -> dict[str, Any]:
        return {"name": self.name, "key": self.key, "offset": self.offset, "byte_size": self.byte_size}


def _close(region: _Region) -> None:
    os.close(region.fd)
    try:
        if region.mm is not None:
            region.mm.close()
    except BufferError:  # a request still reads a view of it: the mapping goes with the last view
        pass


def _check_registration(name: object, key: object, offset: object, byte_size: object) -> None:
    """What a register request names, checked before anything is opened."""
    if not isinstance(name, str) or not name or len(name) > 256:
        raise InvalidInput("region name must be a non-empty string of at most 256 characters")
    if (
        not isinstance(key, str)
        or not key.startswith("/")
        or "/" in key[1:]
        or key in ("/", "/.", "/..")
        or "\0" in key
    ):
        raise InvalidInput(f"key must be a POSIX shared memory name like '/name', got {str(key)[:80]!r}")
    if (
        isinstance(offset, bool)
        or isinstance(byte_size, bool)
        or not isinstance(offset, int)
        or not isinstance(byte_size, int)
    ):
        raise InvalidInput("offset and byte_size must be integers")
    if offset < 0 or byte_size <= 0:
        raise InvalidInput("offset must be >= 0 and byte_size > 0")


class SharedMemory:
    """The registered regions (thread-safe). in_place: map them and let reads and the runtime's writes use the
    mapping (no copies; a truncation during a request can fault the process), else pread/pwrite (see above)."""

    def __init__(self, in_place: bool = False) -> None:
        self.in_place = bool(in_place)
        self._lock = threading.Lock()
        self._regions: dict[str, _Region] = {}

    def register(self, name: str, key: str, offset: int, byte_size: int) -> None:
        _check_registration(name, key, offset, byte_size)
        with self._lock:
            if name in self._regions:
                raise AlreadyExists(f"shared memory region {name!r} is already registered; unregister it first")
            if len(self._regions) >= MAX_REGIONS:
                raise InvalidInput(f"at most {MAX_REGIONS} shared memory regions may be registered")
        path = os.path.join(SHM_DIR, key[1:])
        try:
            fd = os.open(path, os.O_RDWR | os.O_NOFOLLOW | os.O_CLOEXEC)
        except OSError as exc:
            raise InvalidInput(f"cannot open shared memory {key!r}: {exc.strerror}") from None
        try:
            st = os.fstat(fd)
            real = st.st_size
            if offset + byte_size > real:
                raise InvalidInput(
                    f"region {name!r}: offset {offset} + byte_size {byte_size} exceeds the real size {real} of {key!r}"
                )
            mm = None
            if self.in_place:
                mm = mmap.mmap(fd, offset + byte_size, mmap.MAP_SHARED, mmap.PROT_READ | mmap.PROT_WRITE)
        except BaseException:
            os.close(fd)
            raise
        region = _Region(name, key, offset, byte_size, fd, mm, (st.st_dev, st.st_ino))
        with self._lock:
            if name in self._regions:  # registered meanwhile
                if mm is not None:
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
                region.gone = True
            idle = [r for r in gone if not r.users]
        for region in idle:
            _close(region)

    def close(self) -> None:
        self.unregister("")

    def _window(self, region_name: str, offset: int, size: int, what: str) -> memoryview:
        return self._locate(region_name, offset, size, what)[0]

    @contextmanager
    def _held(self, region_name: str, offset: int, size: int, what: str) -> Iterator[tuple[_Region, int]]:
        """The region and the window's start in its memory object, checked against the registered window; its
        descriptor stays open until the block ends, whatever an unregister does meanwhile."""
        with self._lock:
            region = self._regions.get(region_name)
            if region is not None:
                region.users += 1
        if region is None:
            raise InvalidInput(f"{what}: shared memory region {region_name!r} is not registered")
        try:
            if offset + size > region.byte_size:
                raise InvalidInput(
                    f"{what}: offset {offset} + {size} bytes run past region {region_name!r} of "
                    f"{region.byte_size} bytes"
                )
            yield region, region.offset + offset
        finally:
            with self._lock:
                region.users -= 1
                last = region.gone and not region.users
            if last:
                _close(region)

    def _too_small(self, region: _Region, start: int, size: int, what: str) -> InvalidInput:
        try:
            real: int | str = os.fstat(region.fd).st_size
        except OSError as exc:
            return InvalidInput(f"{what}: region {region.name!r} is gone: {exc.strerror}")
        return InvalidInput(
            f"{what}: region {region.name!r} ({region.key}) is now {real} bytes, too small for bytes "
            f"{start}..{start + size}"
        )

    def _locate(self, region_name: str, offset: int, size: int, what: str) -> tuple[memoryview, _Region, int]:
        """in_place: the mapped window (bounds-checked against the registration and the region's real size now),
        its region and its start in the memory object."""
        with self._held(region_name, offset, size, what) as (region, start):
            if region.mm is None:
                raise InvalidInput(f"{what}: shared memory region {region_name!r} is not mapped")
            # the size now; 4x cheaper than fstat (the offset is unused)
            if start + size > os.lseek(region.fd, 0, os.SEEK_END):
                raise self._too_small(region, start, size, what)
            try:
                return memoryview(region.mm)[start : start + size], region, start
            except ValueError:
                raise InvalidInput(f"{what}: shared memory region {region_name!r} was unregistered") from None

    def read(self, slot: ShmSlot) -> np.ndarray:
        """The input: read (preadv) into a fresh array, or in_place an array over the mapping (no copy)."""
        what = f"input {slot.name!r}"
        wire = slot.dtype.newbyteorder("<") if slot.dtype.itemsize > 1 else slot.dtype
        if self.in_place:
            arr = np.frombuffer(
                self._window(slot.region, slot.offset, slot.size, what), dtype=wire, count=slot.elements
            )
        else:
            arr = np.empty(slot.elements, dtype=wire)
            view, got = arr.data.cast("B"), 0
            with self._held(slot.region, slot.offset, slot.size, what) as (region, start):
                while got < slot.size:  # one call unless over 2 GiB (Linux's cap on one read)
                    try:
                        n = os.preadv(region.fd, [view[got:]], start + got)
                    except OSError as exc:
                        raise InvalidInput(f"{what}: region {slot.region!r} cannot be read: {exc.strerror}") from None
                    if not n:  # the file ends before the window does: its owner shrank it
                        raise self._too_small(region, start, slot.size, what)
                    got += n
        return (arr.view(np.uint8) != 0 if slot.dtype == np.bool_ else arr).reshape(slot.shape)

    def write(self, name: str, arr: np.ndarray, target: ShmOut) -> int:
        """Copy an output into its region; InvalidInput when it does not fit the space the request gave."""
        if arr.dtype.kind == "O":
            raise InvalidInput(f"output {name!r}: BYTES outputs in shared memory are not supported")
        data = np.ascontiguousarray(arr, dtype=arr.dtype.newbyteorder("<") if arr.dtype.itemsize > 1 else arr.dtype)
        _fits(name, data.nbytes, target)
        what = f"output {name!r}"
        if self.in_place:
            view = self._window(target.region, target.offset, data.nbytes, what)
            view[:] = data.data.cast("B")
            return int(data.nbytes)
        with self._held(target.region, target.offset, data.nbytes, what) as (region, start):
            try:  # never past the file's end: pwrite there would grow the region its owner shrank
                if start + data.nbytes > os.lseek(region.fd, 0, os.SEEK_END):
                    raise self._too_small(region, start, data.nbytes, what)
                put = os.pwrite(region.fd, data.data.cast("B"), start) if data.nbytes else 0
            except OSError as exc:
                raise InvalidInput(f"{what}: region {target.region!r} cannot be written: {exc.strerror}") from None
            if put != data.nbytes:
                raise self._too_small(region, start, data.nbytes, what)
        return int(data.nbytes)

    def place(
        self, name: str, dtype: np.dtype, shape: tuple[int, ...], target: ShmOut, inputs: list[ShmSlot]
    ) -> np.ndarray | None:
        """The output's window as a little-endian array for the runtime to write into during the run (no copy
        after it), bounds-checked as write() checks; None when it is empty or overlaps a shared-memory input
        of the request (its memory object and bytes, however registered), and always unless in_place: then it is
        written after the run."""
        nbytes = math.prod(shape) * dtype.itemsize
        _fits(name, nbytes, target)
        if not nbytes or not self.in_place:
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
