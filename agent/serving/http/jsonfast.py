"""Large JSON infer requests parsed without a Python object per number (simdjson): each input's numeric `data`
becomes a numpy array straight from the parsed document, its shape and element count checked against the header
first; what the parse holds (simdjson's tape and indexes, the tensor) is charged, not a worst case of Python objects.

Anything this path is unsure of goes through the strict Python parser (jsondata.parse_json, charged as before), so
errors (lies, malformed numbers, NaN/Inf text, out-of-range integers, deep nesting) read exactly as they always did.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, NamedTuple

import numpy as np

from agent.serving.budget import JSON_DECODE_FACTOR, kept_parser_cost, parse_cost
from agent.serving.codec import Charge, no_charge
from agent.serving.errors import PayloadTooLarge, ServerBusy
from agent.serving.http.jsondata import json_tensor, parse_json

try:  # a dependency (pyproject); without it every request takes the Python parser
    import simdjson
except ImportError:  # pragma: no cover - the project installs it
    simdjson = None  # type: ignore[assignment]

FAST_MIN = 64 << 10  # smaller bodies: the Python parser is as quick and its worst case is small
_MAX_DIMS = 32  # as decode._shape
_MAX_SKELETON_DEPTH = 256  # deeper documents take the Python parser (its recursion limit names the error)
_BOM = b"\xef\xbb\xbf"


class Unsure(Exception):
    """The fast path cannot vouch for this document: the Python parser decides."""


class NumericData:
    """An input's `data` array as simdjson parsed it: regular, `shape` as the text nests it (not yet converted)."""

    __slots__ = ("arr", "shape", "parser", "text_size")

    def __init__(self, arr: Any, shape: tuple[int, ...], parser: Any, text_size: int):
        self.arr, self.shape, self.parser, self.text_size = arr, shape, parser, text_size

    def count(self) -> int:
        return int(np.prod(self.shape, dtype=np.int64)) if self.shape else 0

    def materialize(self, charge: Charge) -> Any:
        """The data as Python objects, for the old checks (BOOL, BYTES, or numbers numpy must judge one by one)."""
        charge(self.text_size * JSON_DECODE_FACTOR, "the JSON data's Python objects")
        return self.arr.as_list()

    def tensor(self, name: str, dtype: np.dtype, count: int, charge: Charge) -> np.ndarray:
        """The data as a flat array of `count` elements of `dtype`; the same errors as jsondata.json_tensor."""
        have = self.count()
        kind = "f" if dtype.kind == "V" else dtype.kind  # bfloat16 (ml_dtypes) is a void kind to numpy
        if have != count or not count or kind not in "iuf":
            return json_tensor(name, self.materialize(charge), dtype, count)  # its message, its checks
        binary = count * dtype.itemsize
        counted = hinted(charge, lambda: binary_hint(count, binary, f"input {name!r}"))
        counted(count * 8 + binary, f"input {name!r}'s tensor")  # the 64-bit buffer, then the tensor
        try:
            raw = np.frombuffer(self.arr.as_buffer(of_type="i"), dtype=np.int64)  # all integers: as numpy types them
        except TypeError:  # floats among them (or bools, strings, null: the old path names those)
            if kind in "iu":
                return json_tensor(name, self.materialize(charge), dtype, count)
            try:
                raw = np.frombuffer(self.arr.as_buffer(of_type="d"), dtype=np.float64)
            except (TypeError, ValueError, RuntimeError):
                return json_tensor(name, self.materialize(charge), dtype, count)
        except (ValueError, RuntimeError):  # integers beyond int64: numpy's own types, checked one by one
            return json_tensor(name, self.materialize(charge), dtype, count)
        if raw.size != count:  # a regular array's leaves are numbers (checked in parse_infer); belt and braces
            return json_tensor(name, self.materialize(charge), dtype, count)
        return json_tensor(name, raw, dtype, count)


def _shape(arr: Any) -> tuple[int, ...] | None:
    """The shape of a regular nested array (its leaves unchecked), or None when ragged or too deep."""
    shape: list[int] = []
    level = [arr]
    while True:
        n = len(level[0])
        if any(len(a) != n for a in level):
            return None
        shape.append(n)
        if not n or not isinstance(level[0][0], simdjson.Array):
            return tuple(shape)
        if len(shape) >= _MAX_DIMS:
            return None
        nxt = []
        for a in level:
            for item in a:
                if not isinstance(item, simdjson.Array):
                    return None
                nxt.append(item)
        level = nxt


def _py(value: Any) -> Any:
    if isinstance(value, simdjson.Object):
        return value.as_dict()
    if isinstance(value, simdjson.Array):
        return value.as_list()
    return value


def _keys(obj: Any) -> list[str]:
    keys = list(obj.keys())
    if len(set(keys)) != len(keys):
        raise Unsure  # duplicate keys: the Python parser keeps the last, as it always did
    return keys


def _arrays_and_depth(doc: Any) -> tuple[int, int]:
    """Lists in a Python document and its nesting depth (no recursion)."""
    count, deepest = 0, 0
    stack = [(doc, 1)]
    while stack:
        item, depth = stack.pop()
        if isinstance(item, list):
            count += 1
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item)
        elif isinstance(item, dict):
            deepest = max(deepest, depth)
            stack.extend((v, depth + 1) for v in item.values())
    return count, deepest


# The scan compares the text a slice at a time into one scratch array per thread, kept: a fresh temporary per
# compare would be a block past the daemon's fixed mmap threshold (serving/memory.py), mapped, faulted in page by
# page and unmapped each time (7.7 ms of a 3 MB body's 12 ms decode went to that, 4,500 page faults a request)
_STEP = 1 << 17  # 128 KiB of scratch a thread
_SCRATCH = threading.local()
_MAX_ARRAYS = 1 << 16  # more '[' than this (data nested too finely to walk, or no tensor): the Python parser
_MAX_STRINGS = 4096  # strings (keys included) beyond this (BYTES data, say): the Python parser, as before
_MAX_SKELETON = 4096  # values outside the data arrays (the header proper) beyond this: the Python parser
_STRING_COST = 4  # a Python str holds up to 4 bytes per byte of UTF-8 (one astral character widens it all)
_VALUE_COST = 64  # a Python object of the header, or a lazy simdjson array, with its reference


class Scan(NamedTuple):
    opens: int  # '[' and '{'
    brackets: int  # '['
    separators: int  # ',' and ':'
    commas: int
    strings: int
    string_bytes: int


def _scratch() -> np.ndarray:
    buf: np.ndarray | None = getattr(_SCRATCH, "buf", None)
    if buf is None:
        buf = _SCRATCH.buf = np.empty(_STEP, dtype=np.bool_)
    return buf


def _hits(part: np.ndarray, c: int, scratch: np.ndarray) -> np.ndarray:
    """Where part == c, as a boolean array in the scratch (valid until the next call)."""
    out = scratch[: len(part)]
    np.equal(part, c, out=out)
    return out


def _count(text: bytes | memoryview, chars: bytes) -> int:
    """How many of `chars` the text holds (numpy compares: 3x quicker than bytes.count, a slice at a time)."""
    view, scratch = np.frombuffer(text, dtype=np.uint8), _scratch()
    return sum(
        int(np.count_nonzero(_hits(view[i : i + _STEP], c, scratch))) for i in range(0, len(view), _STEP) for c in chars
    )


def _scan(text: bytes | memoryview) -> Scan:
    """The body's structure characters and strings, in one pass; Unsure when a string holds an escape (a quote
    may then be escaped: the strings' extent is not known without parsing) or there are too many strings."""
    view, scratch = np.frombuffer(text, dtype=np.uint8), _scratch()
    counts = dict.fromkeys(b"[{,:\\", 0)
    quotes = []
    for i in range(0, len(view), _STEP):
        part = view[i : i + _STEP]
        for c in counts:
            counts[c] += int(np.count_nonzero(_hits(part, c, scratch)))
        quotes.append(np.flatnonzero(_hits(part, ord('"'), scratch)) + i)
        if counts[ord("\\")] or sum(len(q) for q in quotes) > 2 * _MAX_STRINGS:
            raise Unsure
    at = np.concatenate(quotes) if quotes else np.empty(0, dtype=np.int64)
    if len(at) % 2:
        raise Unsure  # malformed: the Python parser says where
    inside = int((at[1::2] - at[0::2] - 1).sum())
    commas = counts[ord(",")]
    return Scan(
        counts[ord("[")] + counts[ord("{")], counts[ord("[")], commas + counts[ord(":")], commas, len(at) // 2, inside
    )


def _data_structure(shape: tuple[int, ...]) -> tuple[int, int]:
    """(arrays, commas) of a regular JSON array of `shape`."""
    arrays = commas = 0
    level = 1
    for d in shape:
        arrays += level
        commas += level * max(d - 1, 0)
        level *= d
    return arrays, commas


def _inputs(specs: Any, data: list[NumericData], parser: Any, size: int) -> list[Any]:
    """The request's inputs with each numeric `data` array left in the parser's tape (appended to `data`)."""
    inputs: list[Any] = []
    for spec in specs:
        if not isinstance(spec, simdjson.Object):
            inputs.append(spec)
            continue
        one: dict[str, Any] = {k: spec[k] for k in _keys(spec)}
        raw = one.get("data")
        if isinstance(raw, simdjson.Array):
            shape = _shape(raw)
            if shape is None:
                raise Unsure  # ragged: numpy's own message, from the Python parser
            data.append(NumericData(raw, shape, parser, size))
            one["data"] = data[-1]
        inputs.append(one)
    return inputs


def _fast(text: bytes | memoryview, charge: Charge, what: str) -> Any:
    scan = _scan(text)
    if scan.brackets > _MAX_ARRAYS:
        raise Unsure
    cost = parse_cost(len(text), scan.opens, scan.separators)
    charge(cost + _STRING_COST * scan.string_bytes + _VALUE_COST * (scan.strings + scan.brackets), what)
    parser, top = _parse(
        text, kept_parser_cost(len(text), scan.opens, scan.separators, scan.strings, scan.string_bytes)
    )
    if not isinstance(top, simdjson.Object):
        raise Unsure
    lazy: dict[str, Any] = {key: top[key] for key in _keys(top)}  # strings are Python already (counted above)
    specs = lazy.get("inputs")
    inputs: list[Any] | None = None
    data: list[NumericData] = []
    if isinstance(specs, simdjson.Array):
        inputs = _inputs(specs, data, parser, len(text))
    arrays = commas = 0
    for d in data:
        a, c = _data_structure(d.shape)
        arrays, commas = arrays + a, commas + c
    rest = scan.separators + scan.opens - commas - arrays  # the header's values, all but a few
    if rest > _MAX_SKELETON:
        raise Unsure
    charge(_VALUE_COST * rest, what)
    doc = {k: _py(v) for k, v in lazy.items() if k != "inputs" or inputs is None}
    if inputs is not None:
        doc["inputs"] = [{k: v if k == "data" else _py(v) for k, v in one.items()} if isinstance(one, dict)
                         else _py(one) for one in inputs]  # fmt: skip
    skeleton_arrays, depth = _arrays_and_depth(doc)
    if depth > _MAX_SKELETON_DEPTH:
        raise Unsure
    # every '[' in the body opens an array, or sits in a string: when the count is exactly the arrays seen, no data
    # leaf hides an array (the leaves are all numbers, as_buffer checks the types) and no string holds a '['
    if scan.brackets != skeleton_arrays + arrays:
        raise Unsure
    return doc


# A worker thread keeps its simdjson parser between requests when the server's budget lets it keep the memory
# (keep_parsers): a fresh parser's tape and indexes are fresh mappings, faulted in page by page (1,600 page faults,
# about 2 ms of a 3 MB body's parse). The kept size is the largest kept_parser_cost it has served (what it can
# have touched), asked of the budget before a larger document is parsed; larger bodies take a fresh parser.
KEEP_PARSER_MAX = 16 << 20  # of kept_parser_cost (a body of about 7 MB of FP32 numbers)
_KEPT = threading.local()


def keep_parsers(keep: Callable[[int, int], bool] | None) -> None:
    """Let the calling thread keep a parser between documents, its memory asked of `keep(old, new)` first
    (BodyBudget.keep: the kept read buffers' share of the budget); None drops the kept one (its memory given back
    through the previous `keep`)."""
    old = getattr(_KEPT, "keep", None)
    if old is not None and _KEPT.held:
        old(_KEPT.held, 0)
    _KEPT.keep, _KEPT.held, _KEPT.parser = keep, 0, None


def _kept(cost: int) -> Any:
    """The thread's kept parser, when it may parse a document of this cost; else None."""
    keep = getattr(_KEPT, "keep", None)
    if keep is None or cost > KEEP_PARSER_MAX:
        return None
    if cost > _KEPT.held:
        if not keep(_KEPT.held, cost):
            return None
        _KEPT.held = cost
    if _KEPT.parser is None:
        _KEPT.parser = simdjson.Parser()
    return _KEPT.parser


def _parse(text: bytes | memoryview, cost: int) -> tuple[Any, Any]:
    """(parser, top value) of the text; Unsure for anything simdjson refuses."""
    parser = _kept(cost)
    try:
        if parser is not None:
            try:
                return parser, parser.parse(text)
            except RuntimeError as exc:  # its last document is still referenced: a fresh parser this time
                if "re-use a parser" not in str(exc):
                    raise
        parser = simdjson.Parser()
        return parser, parser.parse(text)
    except Exception:  # noqa: BLE001 - any complaint (syntax, UTF-8, NaN, 1e400, big integers): the Python parser
        raise Unsure from None


def binary_hint(numbers: int, exact: int | None = None, subject: str = "this request's tensors") -> str:
    """What a refused JSON request would take as binary data (the remedy a 413 or 503 names)."""
    size = f"{exact} bytes" if exact is not None else f"about {numbers * 4} bytes as FP32 ({numbers * 8} as FP64/INT64)"
    return (
        f"as binary data {subject} would take {size}, less than as JSON text: send tensors with the binary "
        "tensor extension (the Inference-Header-Content-Length header and parameters.binary_data_size; "
        "tritonclient: binary_data=True)"
    )


JSON_BODY_HINT = (  # a JSON body over the body limit, refused before it is read: its tensors are not known yet
    "a JSON number takes 2-25 bytes of text where binary data takes 1-8 (4 for FP32): send tensors with the binary "
    "tensor extension (the Inference-Header-Content-Length header and parameters.binary_data_size; "
    "tritonclient: binary_data=True)"
)


def hinted(charge: Charge, hint: Callable[[], str]) -> Charge:
    """`charge`, its refusals (413 too large, 503 budget full) extended with `hint`."""

    def counted(n: int, what: str) -> None:
        try:
            charge(n, what)
        except (PayloadTooLarge, ServerBusy) as exc:
            raise type(exc)(f"{exc}; {hint()}") from None

    return counted


def parse_infer(text: bytes | memoryview, charge: Charge = no_charge, what: str = "the request's JSON") -> Any:
    """An infer request's JSON: as jsondata.parse_json, except that in a large body each input's `data` array
    is a NumericData (numbers not yet converted) when it is a regular nested array. A refusal names the remedy."""
    try:
        if simdjson is None or len(text) < FAST_MIN or bytes(text[:3]) == _BOM:
            return parse_json(text, charge, what)
        try:
            return _fast(text, charge, what)
        except Unsure:  # the parser's memory is free again, its charge stays counted until the request ends
            return parse_json(text, charge, what)
    except (PayloadTooLarge, ServerBusy) as exc:
        raise type(exc)(f"{exc}; {binary_hint(_count(text, b',') + 1)}") from None
