"""Small all-JSON infer requests that repeat their header: the checked header is cached under the body's text with
each flat `data` array's numbers cut out, so a repeat parses only its numbers (clients repeat everything but the
data, as they repeat binary headers; decode.py caches those).

Soundness: a slot is `"data": [` + only number characters, commas and whitespace + `]`; those characters cannot
open or close a string, so every body with the same text around its slots tokenizes the same way there. A
template is kept only after the whole body passed the strict parser and each slot was found to be exactly
`inputs[i].data`; a repeat's numbers are read by the same strict decoder, and anything it refuses goes to the
full parser again, so errors read as they always did.
"""

from __future__ import annotations

import math
import re
from typing import Any, NamedTuple

import numpy as np

from agent.serving.budget import JSON_DECODE_FACTOR
from agent.serving.codec import Charge, InferRequest
from agent.serving.errors import InvalidInput, PayloadTooLarge, ServerBusy
from agent.serving.http.jsondata import _DECODER, json_tensor
from agent.serving.http.jsonfast import binary_hint

SLOT = re.compile(rb'"data"\s*:\s*\[([-+0-9.eE,\s]*)\]')
_MAX = 256  # templates kept
_KEY_MAX = 8192  # longer headers are parsed every time (the cache's memory stays bounded: 256 x 8 KiB, as decode's)
# float datatypes a slot of JSON floats converts to directly: the bound below which a double rounds to a finite value
# (the largest finite plus half its last unit rounds to infinity); bfloat16 and every doubt go through json_tensor
_FINITE_BELOW = {
    np.dtype(np.float16): 65520.0,
    np.dtype(np.float32): 2.0**128 - 2.0**103,
    np.dtype(np.float64): math.inf,
}


class Slot(NamedTuple):
    name: str
    dtype: np.dtype
    shape: tuple[int, ...]
    size: int


class Template(NamedTuple):
    slots: tuple[Slot, ...]
    request: InferRequest  # outputs, binary map, id, parameters: shared read-only, copied per request


_TEMPLATES: dict[bytes, Template | None] = {}  # None: a header seen that cannot serve as a template


def clear() -> None:
    _TEMPLATES.clear()


def cached(body: bytes) -> bool:
    """Is there a template for this body's header?"""
    cut = split(body)
    return cut is not None and _TEMPLATES.get(cut[0]) is not None


def split(body: bytes) -> tuple[bytes, list[bytes]] | None:
    """(the body with its slots emptied, each slot's numbers), or None when it has no slot."""
    parts, numbers, at = [], [], 0
    for m in SLOT.finditer(body):
        parts.append(body[at : m.start(1)])
        numbers.append(m.group(1))
        at = m.end(1)
    if not numbers:
        return None
    parts.append(body[at:])
    return b"".join(parts), numbers


def decode(key: bytes, numbers: list[bytes], charge: Charge) -> InferRequest | None:
    """The request from a cached template, or None (no template, or numbers the full parser must judge)."""
    tpl = _TEMPLATES.get(key)
    if tpl is None:
        return None
    need = (len(key) + sum(map(len, numbers))) * JSON_DECODE_FACTOR  # as the full parser is charged
    try:
        charge(need, "the request's JSON")
    except (PayloadTooLarge, ServerBusy) as exc:
        raise type(exc)(f"{exc}; {binary_hint(sum(n.count(b',') + 1 for n in numbers))}") from None
    inputs: dict[str, Any] = {}
    for slot, text in zip(tpl.slots, numbers):
        try:
            data = _DECODER.decode("[" + text.decode("ascii") + "]")
        except (ValueError, InvalidInput):
            return None  # malformed numbers: the full parser names them
        arr = _floats(data, slot)
        if arr is None:
            arr = json_tensor(slot.name, data, slot.dtype, slot.size)
        inputs[slot.name] = arr.reshape(slot.shape)
    req = tpl.request
    return InferRequest(
        inputs=inputs,
        outputs=None if req.outputs is None else list(req.outputs),
        binary=req.binary,
        binary_default=req.binary_default,
        id=req.id,
        classes=req.classes,
        params=req.params,
        shm_out=dict(req.shm_out),
    )


def _floats(data: list[Any], slot: Slot) -> np.ndarray | None:
    """A slot of JSON floats (no integers: a big one converts differently), as many as its shape holds, each
    finite in its float datatype: the array json_tensor makes of them, without its checks; None for anything else
    (json_tensor judges it, with its errors)."""
    bound = _FINITE_BELOW.get(slot.dtype)
    if bound is None or len(data) != slot.size or not data:
        return None
    if not all(type(v) is float for v in data) or not max(map(abs, data)) < bound:
        return None
    return np.array(data, dtype=slot.dtype)  # each double rounded once to the datatype, as astype does


def learn(key: bytes, numbers: list[bytes], doc: Any, req: InferRequest) -> None:
    """Keep the template of a request the full parser accepted (`doc` its parsed JSON) when its slots are exactly
    its inputs' data arrays, in order, and every input carries JSON data (else remember that it cannot be one)."""
    if key in _TEMPLATES or len(key) > _KEY_MAX:
        return
    _keep(key, None)
    specs = doc.get("inputs") if isinstance(doc, dict) else None
    if not isinstance(specs, list) or len(specs) != len(numbers) or req.shm_out:
        return
    try:
        skeleton = _DECODER.decode(key.decode("utf-8"))
    except (ValueError, InvalidInput):
        return
    slots = []
    for spec, text, empty in zip(specs, numbers, skeleton.get("inputs") or []):
        name = spec.get("name")
        arr = req.inputs.get(name)
        if type(arr) is not np.ndarray or not isinstance(spec.get("data"), list) or empty.get("data") != []:
            return
        if _DECODER.decode("[" + text.decode("ascii") + "]") != spec["data"]:
            return
        empty["data"] = spec["data"]
        slots.append(Slot(name, arr.dtype, arr.shape, arr.size))
    if skeleton != doc:  # the slots hold the inputs' data and nothing else differs
        return
    shared = InferRequest(
        inputs={}, outputs=req.outputs, binary=req.binary, binary_default=req.binary_default, id=req.id,
        classes=req.classes, params=req.params, shm_out=req.shm_out,
    )  # fmt: skip
    _keep(key, Template(tuple(slots), shared))


def _keep(key: bytes, tpl: Template | None) -> None:
    if len(_TEMPLATES) >= _MAX:
        _TEMPLATES.clear()
    _TEMPLATES[key] = tpl
