"""Each committed model's golden request, replayed against the new release over the agent's HTTP inference API
(KServe v2 JSON) and compared with the answer release N served (guard/golden.json, written by
`edge-agent release activate` while N still served). Standard library only."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from agent_guard.links import read_json

RTOL, ATOL = 1e-4, 1e-5  # the same model on the same provider: equal up to float summation order


def serving_url(state_dir: Path, pid: int) -> str | None:
    """The inference URL of the agent with this pid (status.json, written before READY=1)."""
    doc = read_json(state_dir / "status.json") or {}
    if doc.get("pid") != pid:
        return None
    url = (doc.get("serving") or {}).get("url")
    return url if isinstance(url, str) else None


def check_all(golden: dict[str, Any], url: str) -> str | None:
    """None when every model answers as recorded; else the first difference, in words."""
    for model in golden.get("models") or []:
        why = check_one(model, url)
        if why:
            return why
    return None


def check_one(model: dict[str, Any], url: str) -> str | None:
    name = model["name"]
    body = json.dumps(model["request"]).encode()
    req = urllib.request.Request(
        f"{url}/v2/models/{name}/infer", data=body, method="POST", headers={"Content-Type": "application/json"}
    )
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            doc = json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return f"model {name}: HTTP {exc.code} {exc.read()[:200].decode(errors='replace')}"
    except (OSError, ValueError) as exc:
        return f"model {name}: no answer ({exc})"
    if str(doc.get("model_version")) != str(model["version"]):
        return f"model {name}: serves version {doc.get('model_version')}, committed {model['version']}"
    got = {o.get("name"): o.get("data") for o in doc.get("outputs") or []}
    for out in model["outputs"]:
        diff = _difference(out["data"], got.get(out["name"]))
        if diff:
            return f"model {name} output {out['name']}: {diff}"
    return None


def _difference(want: list[Any], got: Any) -> str | None:
    if not isinstance(got, list) or len(got) != len(want):
        return f"expected {len(want)} values, got {len(got) if isinstance(got, list) else got!r}"
    for i, (w, g) in enumerate(zip(want, got)):
        if isinstance(w, (int, float)) and isinstance(g, (int, float)):
            if not math.isclose(g, w, rel_tol=RTOL, abs_tol=ATOL):
                return f"value {i} is {g}, release N answered {w}"
        elif w != g:
            return f"value {i} is {g!r}, release N answered {w!r}"
    return None


def load(root: Path) -> dict[str, Any]:
    return read_json(root / "guard" / "golden.json") or {"models": []}
