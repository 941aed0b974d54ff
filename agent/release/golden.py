"""Golden requests for the guard's trial: for each committed model (its slot's input specs), a deterministic
KServe v2 JSON request, and the answer the running release N serves to it now (over its own HTTP API). The guard
(agent_guard.golden) replays them against N+1 and compares."""

from __future__ import annotations

import json
import urllib.request
from pathlib import Path
from typing import Any

from agent.errors import EdgeAgentError

_V2 = {  # numpy / ONNX type names -> KServe v2 datatypes
    "float32": "FP32", "tensor(float)": "FP32", "float64": "FP64", "tensor(double)": "FP64",
    "float16": "FP16", "tensor(float16)": "FP16", "int64": "INT64", "tensor(int64)": "INT64",
    "int32": "INT32", "tensor(int32)": "INT32", "int8": "INT8", "tensor(int8)": "INT8",
    "uint8": "UINT8", "tensor(uint8)": "UINT8", "bool": "BOOL", "tensor(bool)": "BOOL",
}  # fmt: skip


def request_for(specs: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The request, or None when an input has a type JSON cannot carry here (strings, bf16)."""
    inputs = []
    for spec in specs:
        datatype = _V2.get(str(spec.get("dtype")))
        if datatype is None:
            return None
        shape = [d if isinstance(d, int) and d > 0 else 1 for d in spec.get("shape") or []]
        count = 1
        for d in shape:
            count *= d
        inputs.append({"name": spec["name"], "shape": shape, "datatype": datatype, "data": _values(datatype, count)})
    return {"inputs": inputs}


def _values(datatype: str, count: int) -> list[Any]:
    if datatype == "BOOL":
        return [i % 2 == 0 for i in range(count)]
    if datatype.startswith("FP"):
        return [(i % 7) * 0.25 - 0.5 for i in range(count)]
    return [i % 3 for i in range(count)]


def record(state_dir: Path) -> dict[str, Any]:
    """{"url", "models": [{name, version, request, outputs}], "skipped": [...]} from the agent serving now."""
    from agent.lifecycle.slots import ModelSlots
    from agent.util.atomic import read_json

    status = read_json(state_dir / "status.json") or {}
    url = (status.get("serving") or {}).get("url")
    if not url:
        raise EdgeAgentError(f"{state_dir / 'status.json'} names no serving URL: is the agent running?")
    models, skipped = [], []
    for name, slots in ModelSlots(state_dir).all().items():
        entry = slots["committed"]
        if entry is None:
            continue
        request = request_for(entry.input_specs or [])
        if request is None:
            skipped.append({"name": name, "why": "an input type JSON requests cannot carry"})
            continue
        outputs = _ask(url, name, request)
        models.append({"name": name, "version": entry.version, "request": request, "outputs": outputs})
    return {"url": url, "models": models, "skipped": skipped}


def _ask(url: str, name: str, request: dict[str, Any]) -> list[dict[str, Any]]:
    req = urllib.request.Request(
        f"{url}/v2/models/{name}/infer", data=json.dumps(request).encode(), method="POST",
        headers={"Content-Type": "application/json"},
    )  # fmt: skip
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            doc = json.loads(resp.read())
    except (OSError, ValueError) as exc:
        raise EdgeAgentError(f"model {name}: the running agent did not answer its golden request: {exc}") from None
    return [{"name": o["name"], "data": o["data"]} for o in doc.get("outputs") or []]
