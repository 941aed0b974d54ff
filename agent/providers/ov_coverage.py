"""OpenVINO coverage, measured: which ONNX nodes each device takes (`Core.query_model`) and which ran
(the compiled model's runtime graph, `originalLayersNames`), by ONNX node where the names map.

The ONNX frontend names each OpenVINO op after its ONNX node (the node's name, or its first output when the
node has none), with a `/suffix` for the helper ops one node becomes. Nodes that the frontend folds away
(Constant, Identity, shapes known at conversion) map to no op: they are counted as `folded`, not as run.
Nodes the frontend has no conversion rule for are `unconverted` and taken by no device.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from agent.providers.base import Assignment

METHOD = "openvino-query-model+runtime-graph"
_SKIP = {"Parameter", "Result", "Constant"}


def onnx_nodes(path: Path) -> list[tuple[str, tuple[str, ...]]] | None:
    """(op_type, names the frontend may give its ops) per ONNX node; None if the file cannot be read."""
    try:
        import onnx

        graph = onnx.load(str(path), load_external_data=False).graph
    except Exception:  # noqa: BLE001 - no ONNX file: no per-node mapping
        return None
    return [(n.op_type, tuple(k for k in (n.name, *n.output) if k)) for n in graph.node]


def _owner(op_name: str, keys: dict[str, int]) -> int | None:
    """The ONNX node index an OpenVINO op name belongs to ('c1', 'c1/WithoutBiases' -> node of output c1)."""
    if op_name in keys:
        return keys[op_name]
    head = op_name.split("/", 1)[0]
    return keys.get(head)


def measure(core: Any, model: Any, compiled: Any | None, device: str, onnx_path: Path) -> Assignment:
    """Per-device node counts from query_model on `device` (any device string: CPU, HETERO:GPU,CPU, AUTO);
    nodes that ran from `compiled`'s runtime graph when given. 'not measured' when the query fails."""
    try:
        claimed = dict(core.query_model(model, device))
    except Exception as exc:  # noqa: BLE001 - the runtime's refusal is the finding
        return not_measured(f"query_model on {device} failed: {' '.join(str(exc).split())[:200]}")
    ran = _ran(compiled)
    unconverted = [op.get_friendly_name() for op in model.get_ordered_ops() if _is_framework(op)]
    return _count(model, claimed, ran, unconverted, onnx_path, device)


def measure_partial(core: Any, onnx_path: Path, device: str) -> Assignment:
    """A graph the frontend converts only in part: its unconverted nodes are cut out (their inputs become
    outputs, their outputs inputs) and the rest is queried, so what a device takes is still measured."""
    try:
        from openvino.frontend import FrontEndManager

        fe = FrontEndManager().load_by_framework("onnx")
        model = fe.convert_partially(fe.load(str(onnx_path)))
        cut, unconverted = _cut_framework_nodes(model, _onnx_tensor_types(onnx_path))
        claimed = dict(core.query_model(cut, device))
    except Exception as exc:  # noqa: BLE001
        return not_measured(f"partial conversion or query_model on {device} failed: {' '.join(str(exc).split())[:200]}")
    return _count(cut, claimed, None, unconverted, onnx_path, device)


def not_measured(why: str) -> Assignment:
    return Assignment(nodes_total=None, nodes_on_provider=None, method=f"not measured: {why}")


def _is_framework(op: Any) -> bool:
    return "FrameworkNode" in op.get_type_name()


def _ran(compiled: Any | None) -> set[str] | None:
    if compiled is None:
        return None
    names: set[str] = set()
    for op in compiled.get_runtime_model().get_ordered_ops():
        info = op.get_rt_info()
        if "originalLayersNames" in info:
            names.update(n for n in str(info["originalLayersNames"].astype(str)).split(",") if n)
    return names


def _onnx_tensor_types(path: Path) -> dict[str, tuple[list[int], Any]]:
    """Tensor name -> (static dims, numpy dtype) from ONNX shape inference: the types the frontend leaves
    dynamic at an unconverted node's outputs (a plugin does not take ops of dynamic type)."""
    import onnx
    from onnx import helper, shape_inference

    model = shape_inference.infer_shapes(onnx.load(str(path), load_external_data=False))
    found = {}
    for vi in [*model.graph.value_info, *model.graph.output, *model.graph.input]:
        t = vi.type.tensor_type
        dims = [d.dim_value if d.HasField("dim_value") else -1 for d in t.shape.dim]
        if t.elem_type:
            found[vi.name] = (dims, helper.tensor_dtype_to_np_dtype(t.elem_type))
    return found


def _cut_framework_nodes(model: Any, types: dict[str, tuple[list[int], Any]]) -> tuple[Any, list[str]]:
    import openvino as ov

    params, results, names = list(model.get_parameters()), list(model.get_results()), []
    for op in [o for o in model.get_ordered_ops() if _is_framework(o)]:
        names.append(op.get_friendly_name())
        for inp in op.inputs():
            results.append(ov.opset13.result(inp.get_source_output()))
        for out in op.outputs():
            shape, etype = out.get_partial_shape(), out.get_element_type()
            known = next((types[n] for n in out.get_names() if n in types), None)
            if known is not None and (etype.is_dynamic() or shape.rank.is_dynamic):
                shape, etype = ov.PartialShape(known[0]), ov.Type(known[1])
            param = ov.opset13.parameter(shape, etype)
            for target in list(out.get_target_inputs()):
                target.replace_source_output(param.output(0))
            params.append(param)
    return ov.Model(results, params, "coverage-cut"), names


def _count(
    model: Any, claimed: dict[str, str], ran: set[str] | None, unconverted: list[str], onnx_path: Path, device: str
) -> Assignment:
    nodes = onnx_nodes(onnx_path)
    ops = [o for o in model.get_ordered_ops() if o.get_type_name() not in _SKIP and not _is_framework(o)]
    if nodes is None:  # no ONNX graph to map to: count OpenVINO ops
        per_device: dict[str, int] = {}
        for op in ops:
            dev = claimed.get(op.get_friendly_name())
            if dev:
                per_device[dev] = per_device.get(dev, 0) + 1
        return Assignment(
            nodes_total=len(ops) + len(unconverted),
            nodes_on_provider=sum(per_device.values()),
            method=f"{METHOD} on {device} (OpenVINO ops: no ONNX graph to map to)",
            per_device=per_device,
        )
    keys = {k: i for i, (_, ks) in enumerate(nodes) for k in ks}
    devs: dict[int, set[str]] = {}
    mapped: set[int] = set()
    ran_nodes: set[int] = set()
    for op in ops:
        i = _owner(op.get_friendly_name(), keys)
        if i is None:
            continue
        mapped.add(i)
        dev = claimed.get(op.get_friendly_name())
        devs.setdefault(i, set())
        if dev:
            devs[i].add(dev)
        else:
            devs[i].add("")  # an op of this node no device takes
    for name in ran or ():
        i = _owner(name, keys)
        if i is not None:
            ran_nodes.add(i)
    not_taken = {i for i, d in devs.items() if "" in d}
    not_taken |= {i for i in (_owner(n, keys) for n in unconverted) if i is not None}
    per_device = {}
    for i, d in devs.items():
        if i in not_taken:
            continue
        dev = sorted(d)[0] if len(d) == 1 else "+".join(sorted(d))
        per_device[dev] = per_device.get(dev, 0) + 1
    folded = len(nodes) - len(mapped | not_taken)
    on = sum(per_device.values()) + folded
    detail = f"{METHOD} on {device}: " + ", ".join(f"{n} node(s) on {d}" for d, n in sorted(per_device.items()))
    detail += f"; {folded} folded at conversion" if folded else ""
    if not_taken:
        detail += f"; {len(not_taken)} taken by no device"
    if ran is not None:
        detail += f"; {len(ran_nodes)} seen in the runtime graph"
    return Assignment(
        nodes_total=len(nodes),
        nodes_on_provider=on,
        fallback_ops=tuple(dict.fromkeys(nodes[i][0] for i in sorted(not_taken))),
        method=detail,
        per_device=per_device,
    )
