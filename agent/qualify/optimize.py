"""Optimisation variants of an fp32 graph, built offline and measured like precision variants.

Kinds: ORT's offline optimiser at `ort-basic`, `ort-extended` and `ort-all` (SessionOptions.optimized_model_filepath,
saved once per onnxruntime version), `slim` (onnxslim: constant folding, dead-node and redundant-op removal) and,
for graphs that hold attention (detected: MatMul feeding Softmax), `fusions` (onnxruntime.transformers.optimizer:
Attention, LayerNormalization, Gelu, SkipLayerNormalization). Files go to
`<cache>/<model sha>/optimized/<onnxruntime-cpu-<versions digest>>/<kind>.onnx`. A kind whose graph equals the
original's or an earlier kind's is recorded with `same_as` and not measured again.

`build` runs in a child (a crashing optimiser must stay a result); the ORT levels are built with the CPU EP, so
`ort-all` may hold CPU-only layout ops (NCHWc): on another provider such a row fails compatibility or coverage.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path
from typing import Any

from agent.targets import OPTIMIZE_KINDS as KINDS

_ORT_LEVELS = {"ort-basic": "ORT_ENABLE_BASIC", "ort-extended": "ORT_ENABLE_EXTENDED", "ort-all": "ORT_ENABLE_ALL"}
PREFIX = "opt-"  # variant names of optimised graphs: opt-<kind> (or <variant>-opt-<kind>)


def kinds_of(spec: Any) -> tuple[str, ...]:
    """The kinds asked for: True -> all, a list -> those (unknown names raise ValueError), falsy -> none."""
    if not spec:
        return ()
    if spec is True or spec == "all":
        return KINDS
    names = [str(s) for s in (spec if isinstance(spec, (list, tuple)) else [spec])]
    unknown = [n for n in names if n not in KINDS]
    if unknown:
        raise ValueError(f"unknown optimisation {unknown[0]!r}; known: {', '.join(KINDS)}")
    return tuple(k for k in KINDS if k in names)


def variant_name(base: str | None, kind: str) -> str:
    return f"{base}-{PREFIX}{kind}" if base else f"{PREFIX}{kind}"


def kind_of(variant: str | None) -> str | None:
    """The optimisation a variant name stands for, else None."""
    if not variant:
        return None
    tail = variant.rsplit(PREFIX, 1)
    return tail[1] if len(tail) == 2 and tail[1] in KINDS and (tail[0] == "" or tail[0].endswith("-")) else None


def out_dir_for(root: str | Path, model_sha256: str, versions: dict[str, Any]) -> Path:
    from agent.package import caches

    path = Path(root) / model_sha256 / "optimized" / caches.runtime_key("onnxruntime-cpu", versions)
    path.mkdir(parents=True, exist_ok=True)
    return path


def graph_digest(proto: Any) -> str:
    """What makes two graphs the same computation here: nodes, initializers, inputs and outputs (not names of
    the producer, doc strings or metadata)."""
    g = proto.graph
    h = hashlib.sha256()
    for part in (g.node, g.initializer, g.input, g.output):
        for item in part:
            h.update(item.SerializeToString(deterministic=True))
        h.update(b"|")
    for op in sorted((o.domain, o.version) for o in proto.opset_import):
        h.update(repr(op).encode())
    return h.hexdigest()


def is_transformer(proto: Any) -> bool:
    """Attention in the graph: a Softmax fed (through at most a few elementwise ops) by a MatMul."""
    nodes = list(proto.graph.node)
    producer = {out: n for n in nodes for out in n.output}
    for n in nodes:
        if n.op_type != "Softmax":
            continue
        frontier, depth = list(n.input[:1]), 0
        while frontier and depth < 4:
            prev = [producer[i] for i in frontier if i in producer]
            if any(p.op_type in ("MatMul", "Einsum") for p in prev):
                return True
            frontier = [i for p in prev if p.op_type in ("Add", "Mul", "Div", "Where", "Sub") for i in p.input]
            depth += 1
    return False


def build(*, model_path: str, out_dir: str, kinds: list[str]) -> list[dict[str, Any]]:
    """Child task: one record per kind: {kind, file, sha256, changed, same_as, nodes, nodes_before, build_s,
    error, skipped}. A file already built for these versions is reused (its digest is recomputed)."""
    import onnx

    from agent.package import cacheseal
    from agent.util.hashing import sha256_file

    rebuilt = cacheseal.verify_or_reset(out_dir)  # a corrupt or foreign optimised file is rebuilt, never measured
    original = onnx.load(model_path)
    seen = {graph_digest(original): "original"}
    before = len(original.graph.node)
    transformer = is_transformer(original)
    out: list[dict[str, Any]] = []
    for kind in kinds:
        rec: dict[str, Any] = {"kind": kind, "nodes_before": before}
        if kind == "fusions" and not transformer:
            out.append({**rec, "skipped": "no attention in the graph (MatMul -> Softmax): not a transformer"})
            continue
        dest = Path(out_dir) / f"{kind}.onnx"
        t0 = time.perf_counter()
        try:
            if not dest.is_file():
                _make(kind, model_path, dest)
            proto = onnx.load(str(dest))
        except Exception as exc:  # noqa: BLE001 - an optimiser that fails is a record, not a crash
            dest.unlink(missing_ok=True)
            out.append({**rec, "error": f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:300]}"})
            continue
        digest = graph_digest(proto)
        rec.update(file=str(dest), build_s=round(time.perf_counter() - t0, 3), nodes=len(proto.graph.node))
        rec.update(same_as=seen.get(digest), changed=digest not in seen)
        if rec["changed"]:
            seen[digest] = kind
            rec["sha256"] = sha256_file(dest)
        out.append(rec)
    cacheseal.seal(out_dir)
    if rebuilt:
        for rec in out:
            rec["cache_rebuilt"] = rebuilt
    return out


def _make(kind: str, src: str, dest: Path) -> None:
    from agent.util.atomic import atomic_write_bytes

    tmp = dest.with_name(f".{dest.name}.tmp")
    if kind in _ORT_LEVELS:
        import onnxruntime as ort

        so = ort.SessionOptions()
        so.log_severity_level = 4
        so.graph_optimization_level = getattr(ort.GraphOptimizationLevel, _ORT_LEVELS[kind])
        so.optimized_model_filepath = str(tmp)
        ort.InferenceSession(src, so, providers=["CPUExecutionProvider"])
        tmp.replace(dest)
        return
    import onnx

    if kind == "slim":
        import onnxslim

        model = onnxslim.slim(onnx.load(src))
    else:  # fusions: the transformer optimiser's own fusions only (opt_level 0: ORT's levels are other kinds)
        from onnxruntime.transformers import optimizer

        model = optimizer.optimize_model(src, model_type="bert", opt_level=0).model
    atomic_write_bytes(dest, model.SerializeToString())


def variants_for(found: list[Any], kinds: tuple[str, ...], cache_root: Any, run: Any) -> tuple[list[Any], list[Any]]:
    """(optimised Variants to measure, build records) for each fp32 variant. `run(func, kwargs, tag)` is the
    harness's isolated runner. Without a cache root the files go to a temporary directory of this process."""
    import tempfile

    from agent.package import caches
    from agent.package.variants import Variant

    versions = caches.runtime_versions()
    out: list[Any] = []
    records: list[dict[str, Any]] = []
    for v in found:
        if v.precision != "fp32":
            continue
        where = out_dir_for(cache_root, v.sha256, versions) if cache_root else Path(tempfile.mkdtemp(prefix="opt-"))
        res = run(
            "agent.qualify.optimize:build",
            {"model_path": str(v.model_path), "out_dir": str(where), "kinds": list(kinds)},
            "optimize",
        )
        built = res.value if res.ok else [{"kind": k, "error": res.error} for k in kinds]
        for rec in built:
            rec["variant"] = variant_name(v.name, rec["kind"])
            rec["of"] = v.name
            if rec.get("changed"):
                path = Path(rec["file"])
                out.append(Variant(rec["variant"], path, rec["sha256"], "fp32", v.model_path, v.declared))
        records += built
    return out, records


def refusal(kind: str, reason: str) -> str:
    """The reason of an optimised row out of tolerance: the kind and the first output that differs."""
    first = reason.split("accuracy: ", 1)[-1].split("; ")[0]
    return f"refused: {kind} changes the outputs beyond tolerance; first output that differs: {first}"


def serving_graph(selected: Any, records: list[dict[str, Any]]) -> dict[str, Any]:
    """The decision record's `graph`: which file serves and why."""
    if selected is None:
        return {}
    kind = kind_of(selected.variant)
    if not kind:
        tried = [r["kind"] for r in records if r.get("file") and r.get("same_as") is None]
        why = (
            "the graph as delivered: no optimisation variant was built"
            if not tried
            else f"the graph as delivered: no optimised graph ({', '.join(tried)}) passed and beat it beyond noise"
        )
        return {"file": selected.model_path, "optimization": None, "why": why}
    speed = (selected.original or {}).get("speedup")
    why = f"{kind}: within tolerance of the unoptimised fp32 graph and selected on latency" + (
        f" ({speed:.2f}x the original's p50 on {selected.provider})" if speed else ""
    )
    return {"file": selected.model_path, "optimization": kind, "sha256": selected.model_sha256, "why": why}
