"""Real-model packages for the tests, made here by real converters and tools: skl2onnx pipelines (with and
without ZipMap), onnxruntime.quantization (dynamic and static QDQ), fp16 conversion, external data, and
models shipped inside pip packages (magika's content-type model, onnxruntime's logreg_iris). Nothing is
fetched from a model hub: the pip-shipped files are read from the installed wheels."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
import onnx
import yaml
from onnx import TensorProto, helper, numpy_helper


def write_sets(root: Path, model_path: Path, sets: list[dict[str, np.ndarray]]) -> None:
    """test_data_set_N/{input,output}_K.pb: the inputs given, the outputs of plain onnxruntime CPU."""
    import onnxruntime as ort

    sess = ort.InferenceSession(str(model_path), providers=["CPUExecutionProvider"])
    names = [o.name for o in sess.get_outputs()]
    for i, feeds in enumerate(sets):
        ds = root / f"test_data_set_{i}"
        ds.mkdir(parents=True, exist_ok=True)
        for k, (name, arr) in enumerate(feeds.items()):
            (ds / f"input_{k}.pb").write_bytes(numpy_helper.from_array(arr, name).SerializeToString())
        for k, (name, arr) in enumerate(zip(names, sess.run(None, feeds))):
            if isinstance(arr, np.ndarray):
                (ds / f"output_{k}.pb").write_bytes(numpy_helper.from_array(arr, name).SerializeToString())


def write_meta(root: Path, **meta) -> None:
    (root / "model.yaml").write_text(yaml.safe_dump(meta, sort_keys=False))


def _prototypes(classes: int, size: int) -> np.ndarray:
    """One pattern per class: a colour (per-channel offset) and a stripe frequency, as real classes differ."""
    rng = np.random.default_rng(100)
    yy, xx = np.mgrid[0:size, 0:size] / size
    protos = []
    for c in range(classes):
        colour = rng.standard_normal(3)[:, None, None]
        stripes = np.sin(2 * np.pi * ((c % 5 + 1) * xx + (c // 5 + 1) * yy))
        protos.append(colour + stripes[None])
    return np.asarray(protos, np.float32)


def image_sets(n: int, size: int = 48, seed: int = 1, classes: int = 10) -> list[dict[str, np.ndarray]]:
    """Images of `classes` kinds: a fixed prototype per class plus noise (class i % classes for set i)."""
    rng, protos = np.random.default_rng(seed), _prototypes(classes, size)
    return [
        {"input": (protos[i % classes] + 0.8 * rng.standard_normal((3, size, size)))[None].astype(np.float32)}
        for i in range(n)
    ]


def classifier_model(seed: int = 0, classes: int = 10, size: int = 48, width: int = 32) -> onnx.ModelProto:
    """An image classifier wide enough that int8 kernels pay off (3 convs, pooling, Gemm, Softmax) and
    trained: its last layer is fitted (ridge regression) to image_sets' classes, so top-1 has real margins."""
    import onnxruntime as ort

    rng = np.random.default_rng(seed)

    def w(*shape, scale):
        return (rng.standard_normal(shape) * scale).astype(np.float32)

    arrays = {
        "w1": w(width, 3, 3, 3, scale=0.3),
        "b1": w(width, scale=0.1),
        "w2": w(2 * width, width, 3, 3, scale=0.08),
        "b2": w(2 * width, scale=0.1),
        "w3": w(2 * width, 2 * width, 3, 3, scale=0.06),
        "b3": w(2 * width, scale=0.1),
    }
    nodes = [
        helper.make_node("Conv", ["input", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("Conv", ["r2", "w3", "b3"], ["c3"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c3"], ["r3"]),
        helper.make_node("GlobalAveragePool", ["r3"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
    ]
    x_in = helper.make_tensor_value_info("input", TensorProto.FLOAT, [1, 3, size, size])
    inits = [numpy_helper.from_array(a, n) for n, a in arrays.items()]

    def model(graph_nodes, out):
        m = helper.make_model(
            helper.make_graph(graph_nodes, "classifier", [x_in], [out], inits),
            opset_imports=[helper.make_opsetid("", 17)],
        )
        m.ir_version = 8
        return m

    feats = model(nodes, helper.make_tensor_value_info("f", TensorProto.FLOAT, [1, 2 * width]))
    sess = ort.InferenceSession(feats.SerializeToString(), providers=["CPUExecutionProvider"])
    train = image_sets(20 * classes, size, seed=7, classes=classes)
    f = np.concatenate([sess.run(None, t)[0] for t in train])
    mean = f.mean(axis=0)
    onehot = np.eye(classes)[[i % classes for i in range(len(train))]] * 8.0 - 4.0
    fc = f - mean
    wf = np.linalg.solve(fc.T @ fc + 1e-3 * np.eye(fc.shape[1]), fc.T @ onehot).astype(np.float32)
    bf = (-mean @ wf).astype(np.float32)
    inits += [numpy_helper.from_array(wf, "wf"), numpy_helper.from_array(bf, "bf")]
    nodes += [
        helper.make_node("Gemm", ["f", "wf", "bf"], ["logits"]),
        helper.make_node("Softmax", ["logits"], ["probabilities"], axis=1),
    ]
    return model(nodes, helper.make_tensor_value_info("probabilities", TensorProto.FLOAT, [1, classes]))


def classifier_package(root: Path, *, sets: int = 24, name: str = "classifier", version: str = "1") -> Path:
    """An fp32 classifier package with `sets` golden sets (plain ORT CPU outputs)."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(classifier_model(), root / "model.onnx")
    write_sets(root, root / "model.onnx", image_sets(sets))
    write_meta(root, name=name, version=version, task="classification")
    return root


def qdq_with_original(root: Path, *, sets: int = 24, version: str = "1") -> Path:
    """An int8 QDQ classifier (onnxruntime.quantization.quantize_static, calibrated on the golden inputs) as
    model.onnx, its fp32 original as model_fp32.onnx (`reference:`)."""
    from onnxruntime import quantization as q

    root.mkdir(parents=True, exist_ok=True)
    onnx.save(classifier_model(), root / "model_fp32.onnx")
    data = image_sets(sets)

    class Reader:
        def __init__(self):
            self.it = iter(data)

        def get_next(self):
            return next(self.it, None)

    q.quantize_static(
        str(root / "model_fp32.onnx"),
        str(root / "model.onnx"),
        Reader(),
        quant_format=q.QuantFormat.QDQ,
        per_channel=True,
        activation_type=q.QuantType.QUInt8,
        weight_type=q.QuantType.QInt8,
    )
    write_sets(root, root / "model.onnx", data)
    write_meta(root, name="qdq-classifier", version=version, task="classification", reference="model_fp32.onnx")
    return root


def mlp_model(seed: int = 0, d_in: int = 64, hidden: int = 256, d_out: int = 16) -> onnx.ModelProto:
    rng = np.random.default_rng(seed)
    arrays = {
        "w1": (rng.standard_normal((d_in, hidden)) * 0.15).astype(np.float32),
        "b1": (rng.standard_normal(hidden) * 0.1).astype(np.float32),
        "w2": (rng.standard_normal((hidden, d_out)) * 0.1).astype(np.float32),
    }
    nodes = [
        helper.make_node("MatMul", ["x", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["y"]),
    ]
    graph = helper.make_graph(
        nodes,
        "mlp",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [8, d_in])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [8, d_out])],
        [numpy_helper.from_array(a, n) for n, a in arrays.items()],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    return model


def mlp_sets(n: int = 4, seed: int = 2) -> list[dict[str, np.ndarray]]:
    rng = np.random.default_rng(seed)
    return [{"x": rng.standard_normal((8, 64)).astype(np.float32)} for _ in range(n)]


def dynamic_int8_package(root: Path) -> Path:
    """onnxruntime.quantization.quantize_dynamic of an MLP (DynamicQuantizeLinear + MatMulInteger), with
    its fp32 original as `reference:`."""
    from onnxruntime import quantization as q

    root.mkdir(parents=True, exist_ok=True)
    onnx.save(mlp_model(), root / "model_fp32.onnx")
    q.quantize_dynamic(str(root / "model_fp32.onnx"), str(root / "model.onnx"), weight_type=q.QuantType.QInt8)
    write_sets(root, root / "model.onnx", mlp_sets())
    write_meta(root, name="dynamic-int8-mlp", version="1", task="regression", reference="model_fp32.onnx")
    return root


def fp16_package(root: Path, *, keep_io_types: bool = True) -> Path:
    """onnxruntime's float16 converter (onnxruntime.transformers.float16) on the classifier; golden outputs
    from the fp32 original, which is `reference:`."""
    from onnxruntime.transformers.float16 import convert_float_to_float16

    root.mkdir(parents=True, exist_ok=True)
    fp32 = classifier_model()
    onnx.save(fp32, root / "model_fp32.onnx")
    onnx.save(_toposorted(convert_float_to_float16(fp32, keep_io_types=keep_io_types)), root / "model.onnx")
    data = image_sets(8)
    if not keep_io_types:
        data = [{k: v.astype(np.float16) for k, v in d.items()} for d in data]
    write_sets(root, root / "model.onnx", data)
    write_meta(root, name="fp16-classifier", version="1", task="classification", reference="model_fp32.onnx")
    return root


def _toposorted(model: onnx.ModelProto) -> onnx.ModelProto:
    """The float16 converter appends its input Casts at the end of the node list; the checker wants order."""
    known = {i.name for i in model.graph.input} | {i.name for i in model.graph.initializer} | {""}
    pending, ordered = list(model.graph.node), []
    while pending:
        ready = [n for n in pending if all(i in known for i in n.input)]
        if not ready:
            raise ValueError("graph has a cycle")
        for n in ready:
            ordered.append(n)
            known.update(n.output)
        pending = [n for n in pending if n not in ready]
    del model.graph.node[:]
    model.graph.node.extend(ordered)
    return model


def external_data_package(root: Path) -> Path:
    """The MLP saved with its weights in an external data file (model.onnx + weights.bin)."""
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(mlp_model(), root / "model.onnx", save_as_external_data=True, location="weights.bin", size_threshold=0)
    write_sets(root, root / "model.onnx", mlp_sets(2))
    write_meta(root, name="external-mlp", version="1")
    return root


def _iris():
    rng = np.random.default_rng(3)
    centers = np.array([[5.0, 3.4, 1.5, 0.2], [5.9, 2.8, 4.3, 1.3], [6.6, 3.0, 5.6, 2.0]], np.float32)
    y = np.repeat(np.arange(3), 40)
    x = (centers[y] + rng.standard_normal((120, 4)) * 0.3).astype(np.float32)
    return x, y


def sklearn_package(root: Path, *, zipmap: bool) -> Path:
    """skl2onnx: StandardScaler + LogisticRegression; ZipMap on (skl2onnx's default) or off."""
    from skl2onnx import to_onnx
    from sklearn.linear_model import LogisticRegression
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    x, y = _iris()
    pipe = make_pipeline(StandardScaler(), LogisticRegression(max_iter=500)).fit(x, y)
    options = None if zipmap else {id(pipe.steps[-1][1]): {"zipmap": False}}
    model = to_onnx(pipe, x[:1], options=options, target_opset={"": 17, "ai.onnx.ml": 3})
    root.mkdir(parents=True, exist_ok=True)
    onnx.save(model, root / "model.onnx")
    name = "sklearn-zipmap" if zipmap else "sklearn-logreg"
    if not zipmap:
        write_sets(root, root / "model.onnx", [{"X": x[:1]}])
    write_meta(root, name=name, version="1")
    return root


def _shipped(module: str, rel: str) -> Path:
    spec = importlib.util.find_spec(module)
    if spec is None or spec.origin is None:
        raise FileNotFoundError(f"{module} is not installed")
    path = Path(spec.origin).parent / rel
    if not path.is_file():
        raise FileNotFoundError(f"{module} does not ship {rel}")
    return path


def magika_package(root: Path, sample_files: list[Path]) -> Path:
    """magika's content-type model (shipped in its wheel): int32 byte features [N, 2048] -> 214 classes.
    Inputs are built from real files as magika does: the first and last 1024 bytes, padded with 256."""
    root.mkdir(parents=True, exist_ok=True)
    shipped = sorted(_shipped("magika", "__init__.py").parent.glob("models/standard_v*/model.onnx"))
    if not shipped:
        raise FileNotFoundError("magika ships no models/standard_v*/model.onnx")
    shutil.copyfile(shipped[-1], root / "model.onnx")
    sets = []
    for f in sample_files:
        data = f.read_bytes()
        beg = list(data[:1024]) + [256] * max(0, 1024 - len(data))
        end = [256] * max(0, 1024 - len(data)) + list(data[-1024:])
        sets.append({"bytes": np.array([beg[:1024] + end[-1024:]], dtype=np.int32)})
    write_sets(root, root / "model.onnx", sets)
    write_meta(root, name="magika", version="3.3", task="classification")
    return root


def ort_logreg_iris_package(root: Path) -> Path:
    """onnxruntime's own logreg_iris.onnx (shipped in the onnxruntime wheel): ends in ZipMap."""
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(_shipped("onnxruntime", "datasets/logreg_iris.onnx"), root / "model.onnx")
    write_meta(root, name="ort-logreg-iris", version="1")
    return root
