"""JSON tensor data, both ways: strict JSON parsing (its decoded size charged first), a tensor's JSON `data` checked
against its shape and datatype, and an output's data as JSON (when it has no NaN or Inf, which JSON lacks)."""

from __future__ import annotations

import json
from typing import Any

import numpy as np

from agent.serving.budget import JSON_DECODE_FACTOR
from agent.serving.codec import Charge, no_charge, oip_name
from agent.serving.errors import InvalidInput


def _flatten(data: Any) -> list[Any]:
    out: list[Any] = []
    stack = [data]
    while stack:
        item = stack.pop()
        if isinstance(item, list):
            stack.extend(reversed(item))
        else:
            out.append(item)
    return out


def _json_bytes(name: str, data: Any, count: int) -> np.ndarray:
    flat = _flatten(data) if isinstance(data, list) else [data]
    if len(flat) != count:
        raise InvalidInput(f"input {name!r}: shape holds {count} elements but 'data' has {len(flat)}")
    if not all(isinstance(s, str) for s in flat):
        raise InvalidInput(f"input {name!r}: BYTES data in JSON must be strings")
    try:
        "".join(flat).encode("utf-8")
    except UnicodeEncodeError:
        raise InvalidInput(f"input {name!r}: BYTES data holds a lone surrogate, which is not text") from None
    arr = np.empty(count, dtype=object)
    arr[:] = flat
    return arr


def _exact_ints(name: str, data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    """Integer data numpy did not type as integers (huge values, or floats mixed in): checked one by one."""
    flat = _flatten(data) if isinstance(data, list) else [data]
    if len(flat) != count:
        raise InvalidInput(f"input {name!r}: shape holds {count} elements but 'data' has {len(flat)}")
    info = np.iinfo(dtype)
    for v in flat:
        if not isinstance(v, int):
            raise InvalidInput(f"input {name!r}: {oip_name(dtype)} data must be integers, got {str(v)[:40]}")
        if not info.min <= v <= info.max:
            raise InvalidInput(f"input {name!r}: {v} is out of range for {oip_name(dtype)} ({info.min}..{info.max})")
    return np.array(flat, dtype=dtype)


def _json_numeric(name: str, data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    try:
        raw = np.asarray(data)  # a list (numpy types it), or jsonfast's array of the parsed numbers
    except (ValueError, OverflowError, RecursionError, TypeError) as exc:
        raise InvalidInput(f"input {name!r}: 'data' is not a regular array ({str(exc)[:120]})") from None
    kind = "f" if dtype.kind == "V" else dtype.kind  # bfloat16 (ml_dtypes) is a void kind to numpy
    if raw.size != count:
        raise InvalidInput(f"input {name!r}: shape holds {count} elements but 'data' has {raw.size}")
    if not raw.size:
        return np.empty(0, dtype=dtype)
    if kind in "iu":
        if raw.dtype.kind not in "biu":  # float64 or object: big integers numpy could not type, or non-integers
            return _exact_ints(name, raw.tolist() if raw.dtype.kind == "O" else data, dtype, count)
        info = np.iinfo(dtype)
        lo, hi = int(raw.min()), int(raw.max())
        if lo < info.min or hi > info.max:
            bad = lo if lo < info.min else hi
            raise InvalidInput(f"input {name!r}: {bad} is out of range for {oip_name(dtype)} ({info.min}..{info.max})")
        return raw.astype(dtype, copy=False).reshape(-1)
    if kind == "b":
        if raw.dtype.kind != "b":
            raise InvalidInput(f"input {name!r}: BOOL data must be true or false")
        return raw.reshape(-1)
    if raw.dtype.kind == "O":  # integers too large for int64/uint64, maybe mixed with floats
        flat = raw.reshape(-1).tolist()
        if not all(isinstance(v, (int, float)) and not isinstance(v, bool) for v in flat):
            raise InvalidInput(f"input {name!r}: {oip_name(dtype)} data must be numbers")
        try:
            raw = np.array([float(v) for v in flat])
        except OverflowError:
            raise InvalidInput(f"input {name!r}: a value is out of range for {oip_name(dtype)}") from None
    elif raw.dtype.kind not in "biuf":
        raise InvalidInput(f"input {name!r}: {oip_name(dtype)} data must be numbers")
    with np.errstate(over="ignore", invalid="ignore"):
        out = raw.astype(dtype).reshape(-1)
        finite = bool(np.isfinite(out if dtype.kind == "f" else out.astype(np.float32)).all())
    if not finite:
        raise InvalidInput(
            f"input {name!r}: a value is out of range for {oip_name(dtype)} (largest finite "
            f"{float(np.finfo(dtype).max):.8g}); JSON carries finite numbers only: send NaN or Inf as binary data"
        )
    return out


def json_tensor(name: str, data: Any, dtype: np.dtype, count: int) -> np.ndarray:
    """An input's JSON `data` as a flat array of `count` elements of `dtype` (BYTES: str objects)."""
    return _json_bytes(name, data, count) if dtype.kind == "O" else _json_numeric(name, data, dtype, count)


def _refuse_constant(token: str) -> Any:
    raise InvalidInput(
        f"malformed JSON: {token} is not a JSON number (JSON carries finite numbers only; "
        "send NaN or Inf as binary data, parameters.binary_data_size)"
    )


_DECODER = json.JSONDecoder(parse_constant=_refuse_constant)


def parse_json(text: bytes | memoryview, charge: Charge = no_charge, what: str = "the JSON request") -> Any:
    """Strict JSON (UTF-8, no NaN/Infinity), its decoded size counted first; InvalidInput if malformed."""
    charge(len(text) * JSON_DECODE_FACTOR, what)
    try:
        return _DECODER.decode(str(text, "utf-8"))
    except UnicodeDecodeError:
        raise InvalidInput("malformed JSON: not UTF-8") from None
    except ValueError as exc:
        raise InvalidInput(f"malformed JSON: {exc}") from None
    except RecursionError:
        raise InvalidInput("malformed JSON: nested too deeply") from None


def json_data(arr: np.ndarray, datatype: str) -> list[Any]:
    flat = arr.reshape(-1)
    if datatype == "BYTES":
        return [x.decode("utf-8", "replace") if isinstance(x, bytes) else str(x) for x in flat]
    if datatype == "BF16":
        flat = flat.astype(np.float32)
    out: list[Any] = flat.tolist()
    return out


def json_safe(arr: np.ndarray, datatype: str) -> bool:
    """Can the tensor go out as JSON numbers? Not with NaN or Inf, which JSON lacks: such a tensor goes out as
    binary data (the binary tensor extension carries the IEEE values exactly, as Triton does)."""
    if datatype not in ("FP16", "FP32", "FP64", "BF16") or not arr.size:
        return True
    return bool(np.isfinite(arr if datatype != "BF16" else arr.astype(np.float32)).all())
