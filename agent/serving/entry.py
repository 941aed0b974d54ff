"""A served (model, version) and the checks of a request against it: dtypes, shapes, names, text, NaN/Inf."""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from agent.serving import rungate
from agent.serving.errors import InvalidInput
from agent.serving.memory import trim_heap
from agent.serving.metrics import ModelStats


@dataclass(eq=False)
class ModelEntry:
    """One loaded (model, version): its session, metadata and in-flight count."""

    name: str
    version: str
    session: Any  # agent.providers.base.ProviderSession
    meta: dict[str, Any]
    stats: ModelStats
    # per input: (name, dtype, rank, ((axis, size) of static dims), full shape or None if dynamic)
    checks: tuple[Any, ...] = ()
    output_names: tuple[str, ...] = ()
    holds: deque[None] = field(default_factory=deque)  # one item per request in flight (append/pop are atomic)
    observers: tuple[Any, ...] = ()  # run.Observer: offered each successful run (a trial registers them)
    retired: bool = False
    close_when_idle: bool = False
    closed: bool = False
    close_error: str | None = field(default=None, repr=False)

    @property
    def inputs(self) -> list[Any]:
        return list(self.session.inputs) if self.session is not None else []

    @property
    def outputs(self) -> list[Any]:
        return list(self.session.outputs) if self.session is not None else []

    def close(self) -> None:
        """Release the session once (idempotent); remember a failing close instead of raising."""
        if self.closed:
            return
        self.closed = True
        session, self.session = self.session, None
        rungate.disown(session)
        try:
            session.close()
        except Exception as exc:  # noqa: BLE001 - a failing close must not break a swap
            self.close_error = f"{type(exc).__name__}: {exc}"
        del session
        trim_heap()


def _dim(d: Any) -> int | None:
    return d if isinstance(d, int) and not isinstance(d, bool) and d >= 0 else None


def _np_dtype(name: str) -> Any:
    try:
        return np.dtype(name)
    except TypeError:  # e.g. bfloat16 without ml_dtypes imported: compare by name
        return name


def checks_of(session: Any) -> tuple[Any, ...]:
    """Per input: (name, numpy dtype, rank, ((axis, size) for static dims), the whole shape when every dim is
    static else None), precomputed for the hot path."""
    try:
        specs = list(session.inputs)
        outs = tuple(o.name for o in session.outputs)
    except AttributeError as exc:
        raise InvalidInput(f"not a ProviderSession (no inputs/outputs): {exc}") from None
    checks = []
    for spec in specs:
        dims = tuple(_dim(d) for d in spec.shape)
        dtype = "object" if spec.dtype in ("str", "string", "bytes") else spec.dtype
        static = tuple((i, d) for i, d in enumerate(dims) if d is not None)
        checks.append((spec.name, _np_dtype(dtype), len(dims), static, dims if None not in dims else None))
    return tuple(checks), outs


def validate(entry: ModelEntry, feeds: Any) -> None:
    """Reject feeds whose names, dtypes or shapes do not match the session's TensorSpecs (hot path: lean)."""
    if type(feeds) is dict and len(feeds) == len(entry.checks):
        for name, dtype, rank, static, full in entry.checks:  # fast path: exact dtype object, all static dims equal
            arr = feeds.get(name)
            if type(arr) is not np.ndarray or arr.dtype is not dtype:
                break
            if full is not None:  # every dimension static: one tuple comparison
                if arr.shape != full:
                    break
                continue
            if len(arr.shape) != rank:
                break
            for i, size in static:
                if arr.shape[i] != size:
                    break
            else:
                continue
            break
        else:
            return
    validate_slow(entry, feeds)


def validate_slow(entry: ModelEntry, feeds: Any) -> None:
    if not isinstance(feeds, dict):
        raise InvalidInput("feeds must be a mapping of input name to array")
    if len(feeds) != len(entry.checks):
        names_error(entry, feeds)
    for name, dtype, rank, static, _ in entry.checks:
        arr = feeds.get(name)
        if arr is None:
            names_error(entry, feeds)
        if not isinstance(arr, np.ndarray):
            raise InvalidInput(f"input {name!r}: expected a numpy array, got {type(arr).__name__}")
        if arr.dtype != dtype and arr.dtype.name != dtype:
            raise InvalidInput(f"input {name!r}: datatype {_oip(arr.dtype)} does not match the model's {_oip(dtype)}")
        shape = arr.shape
        if len(shape) != rank or any(shape[i] != size for i, size in static):
            _shape_error(entry, name, shape)


def _oip(dtype: Any) -> str:
    """The OIP datatype name of a dtype for messages ("FP64", not "float64")."""
    from agent.serving.codec import datatype_of

    try:
        return datatype_of(dtype if isinstance(dtype, str) else np.dtype(dtype))
    except Exception:  # noqa: BLE001 - a message must not fail
        return str(dtype)


def names_error(entry: ModelEntry, feeds: dict[str, Any]) -> None:
    want = sorted(c[0] for c in entry.checks)
    extra = sorted(set(feeds) - set(want))
    missing = sorted(set(want) - set(feeds))
    what = f"unknown input(s) {extra}" if extra else f"missing input(s) {missing}"
    raise InvalidInput(f"model {entry.name!r}: {what}; expected {want}")


def _shape_error(entry: ModelEntry, name: str, shape: tuple[Any, ...]) -> None:
    spec = next(s for s in entry.inputs if s.name == name)
    want = ["?" if _dim(d) is None else d for d in spec.shape]
    raise InvalidInput(f"input {name!r}: shape {list(shape)} does not match the model's {want}")
