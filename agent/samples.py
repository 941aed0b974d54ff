"""Generated sample models and model packages (ONNX model-zoo layout), used by the quickstart,
tests and benchmarks. Everything is built with onnx.helper; nothing is downloaded.

Package layout written by write_package():
    DIR/model.onnx
    DIR/model.yaml                      name, version, task
    DIR/test_data_set_0/input_0.pb      golden inputs (TensorProto)
    DIR/test_data_set_0/output_0.pb     golden outputs, computed by onnx's reference evaluator
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np

OPSET = 17


def _onnx():
    import onnx  # local import: keep `import agent` light

    return onnx


def cnn_model(seed: int = 0, classes: int = 10, size: int = 32):
    """A small image classifier: Conv-Relu-MaxPool-Conv-Relu-GlobalAveragePool-Flatten-Gemm-Softmax."""
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(seed)
    w1 = (rng.standard_normal((8, 3, 3, 3)) * 0.3).astype(np.float32)
    b1 = (rng.standard_normal(8) * 0.1).astype(np.float32)
    w2 = (rng.standard_normal((16, 8, 3, 3)) * 0.2).astype(np.float32)
    b2 = (rng.standard_normal(16) * 0.1).astype(np.float32)
    wf = (rng.standard_normal((16, classes)) * 0.5).astype(np.float32)
    bf = (rng.standard_normal(classes) * 0.1).astype(np.float32)
    inits = [
        numpy_helper.from_array(a, n)
        for a, n in [(w1, "w1"), (b1, "b1"), (w2, "w2"), (b2, "b2"), (wf, "wf"), (bf, "bf")]
    ]
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    graph = helper.make_graph(
        nodes,
        "sample_cnn",
        [helper.make_tensor_value_info("input", TensorProto.FLOAT, ["batch", 3, size, size])],
        [helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, ["batch", classes])],
        inits,
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edge-agent-samples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def ml_model():
    """A model with an ai.onnx.ml op (Scaler) that OpenVINO cannot compile: Scaler -> Relu."""
    onnx = _onnx()
    from onnx import TensorProto, helper

    nodes = [
        helper.make_node("Scaler", ["x"], ["scaled"], domain="ai.onnx.ml", offset=[0.5] * 4, scale=[2.0] * 4),
        helper.make_node("Relu", ["scaled"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "sample_ml",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
    )
    model = helper.make_model(
        graph,
        opset_imports=[helper.make_opsetid("", OPSET), helper.make_opsetid("ai.onnx.ml", 3)],
        producer_name="edge-agent-samples",
    )
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def tiny_model(bias: float = 1.0, size: int = 4):
    """y = x + bias on a float32 [1, size] input: a ~microsecond model whose output identifies its version."""
    onnx = _onnx()
    from onnx import TensorProto, helper, numpy_helper

    graph = helper.make_graph(
        [helper.make_node("Add", ["x", "bias"], ["y"])],
        "sample_tiny",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, size])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, size])],
        [numpy_helper.from_array(np.full((size,), bias, dtype=np.float32), "bias")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", OPSET)], producer_name="edge-agent-samples")
    model.ir_version = 8
    onnx.checker.check_model(model)
    return model


def reference_outputs(model, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """Golden outputs from onnx's own reference evaluator (independent of any execution provider)."""
    from onnx.reference import ReferenceEvaluator

    return list(ReferenceEvaluator(model).run(None, feeds))


def write_package(
    directory: str | Path,
    model,
    *,
    name: str,
    version: str = "1",
    task: str | None = None,
    feeds: dict[str, np.ndarray] | None = None,
    golden: bool = True,
    extra_yaml: dict[str, Any] | None = None,
) -> Path:
    """Write a model package directory (model.onnx, model.yaml, test_data_set_0) and return its path."""
    onnx = _onnx()
    import yaml
    from onnx import numpy_helper

    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(directory / "model.onnx"))
    meta: dict[str, Any] = {"name": name, "version": str(version)}
    if task:
        meta["task"] = task
    if extra_yaml:
        meta.update(extra_yaml)
    (directory / "model.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))
    if golden:
        if feeds is None:
            feeds = seeded_feeds(model)
        outs = reference_outputs(model, feeds)
        ds = directory / "test_data_set_0"
        ds.mkdir(exist_ok=True)
        for i, (k, v) in enumerate(feeds.items()):
            t = numpy_helper.from_array(v, k)
            (ds / f"input_{i}.pb").write_bytes(t.SerializeToString())
        for i, (out, v) in enumerate(zip(model.graph.output, outs)):
            t = numpy_helper.from_array(np.asarray(v), out.name)
            (ds / f"output_{i}.pb").write_bytes(t.SerializeToString())
    return directory


def seeded_feeds(model, seed: int = 0, dynamic: int = 1) -> dict[str, np.ndarray]:
    """Deterministic inputs that respect the graph's dtypes and shapes (dynamic dims -> `dynamic`)."""
    from onnx import helper

    rng = np.random.default_rng(seed)
    init_names = {i.name for i in model.graph.initializer}
    feeds = {}
    for vi in model.graph.input:
        if vi.name in init_names:
            continue
        tt = vi.type.tensor_type
        dtype = helper.tensor_dtype_to_np_dtype(tt.elem_type)
        shape = [d.dim_value if d.HasField("dim_value") else dynamic for d in tt.shape.dim]
        if np.issubdtype(dtype, np.floating):
            arr = rng.standard_normal(shape).astype(dtype)
        elif dtype == np.bool_:
            arr = rng.integers(0, 2, shape).astype(bool)
        else:
            arr = rng.integers(0, 10, shape).astype(dtype)
        feeds[vi.name] = arr
    return feeds


def sample_cnn_package(directory: str | Path, *, name: str = "sample-cnn", version: str = "1", seed: int = 0) -> Path:
    return write_package(directory, cnn_model(seed), name=name, version=version, task="classification")


def sample_ml_package(directory: str | Path, *, name: str = "sample-ml", version: str = "1") -> Path:
    return write_package(directory, ml_model(), name=name, version=version)


def sample_tiny_package(
    directory: str | Path, *, name: str = "tiny", version: str = "1", bias: float | None = None
) -> Path:
    b = float(version) if bias is None and str(version).replace(".", "", 1).isdigit() else (bias or 1.0)
    return write_package(directory, tiny_model(b), name=name, version=version)
