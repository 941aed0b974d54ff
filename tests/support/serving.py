"""Shared helpers for the serving tests: real cpu-provider sessions of generated models (no tests here)."""

from __future__ import annotations

import contextlib
import json
import threading
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto, helper

from agent.providers import get
from agent.providers.base import ProviderSession

OPSET = [helper.make_opsetid("", 17)]
# ONNX element type per KServe datatype (BF16 is left out: ORT's Python API cannot take bfloat16 numpy arrays).
ALL_TYPES = {
    "BOOL": TensorProto.BOOL,
    "UINT8": TensorProto.UINT8,
    "UINT16": TensorProto.UINT16,
    "UINT32": TensorProto.UINT32,
    "UINT64": TensorProto.UINT64,
    "INT8": TensorProto.INT8,
    "INT16": TensorProto.INT16,
    "INT32": TensorProto.INT32,
    "INT64": TensorProto.INT64,
    "FP16": TensorProto.FLOAT16,
    "FP32": TensorProto.FLOAT,
    "FP64": TensorProto.DOUBLE,
    "BYTES": TensorProto.STRING,
}


def _model(nodes, inputs, outputs, inits=()):
    m = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs, list(inits)), opset_imports=OPSET)
    m.ir_version = 8
    onnx.checker.check_model(m)
    return m


def cast_model(src: int, dst: int) -> onnx.ModelProto:
    """One Cast node from dtype `src` to `dst` on a [1, 3] tensor (opset 17, IR 9: BF16 both ways)."""
    graph = helper.make_graph(
        [helper.make_node("Cast", ["x"], ["y"], to=dst)],
        "cast",
        [helper.make_tensor_value_info("x", src, [1, 3])],
        [helper.make_tensor_value_info("y", dst, [1, 3])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 9
    return model


# One intra-op thread: a test that compares compute times keeps the pool's cache effects out of its figures (a
# run's CPU time counts the pool's threads too: docs/serving.md, "Compute time").
SINGLE_THREAD = {"intra_op_num_threads": 1}


def open_session(model, directory: Path, name: str = "model.onnx", options: dict | None = None) -> ProviderSession:
    """Save `model` and open it with the real cpu provider (`options`: the provider's session options)."""
    path = Path(directory) / name
    path.parent.mkdir(parents=True, exist_ok=True)
    onnx.save(model, str(path))
    return get("cpu").open_session(path, options=options)


def identity_all_types_model():
    """in_<TYPE> -> Identity -> out_<TYPE> for every KServe datatype ORT can take, dynamic length."""
    vi = helper.make_tensor_value_info
    return _model(
        [helper.make_node("Identity", [f"in_{k}"], [f"out_{k}"]) for k in ALL_TYPES],
        [vi(f"in_{k}", t, ["n"]) for k, t in ALL_TYPES.items()],
        [vi(f"out_{k}", t, ["n"]) for k, t in ALL_TYPES.items()],
    )


def log_model():
    """y = Log(x): negative inputs give NaN, zero gives -Inf."""
    vi = helper.make_tensor_value_info
    return _model(
        [helper.make_node("Log", ["x"], ["y"])],
        [vi("x", TensorProto.FLOAT, [1, 4])],
        [vi("y", TensorProto.FLOAT, [1, 4])],
    )


def reshape_model():
    """y = Reshape(x, shape): the runtime fails when `shape` does not fit x (a real runtime error)."""
    vi = helper.make_tensor_value_info
    return _model(
        [helper.make_node("Reshape", ["x", "shape"], ["y"])],
        [vi("x", TensorProto.FLOAT, [1, 4]), vi("shape", TensorProto.INT64, [2])],
        [vi("y", TensorProto.FLOAT, ["a", "b"])],
    )


class GatedSession(ProviderSession):
    """A real session whose run() waits for `gate` after signalling `entered`: holds a request in flight."""

    def __init__(self, inner: ProviderSession):
        self.inner = inner
        self.inputs, self.outputs = inner.inputs, inner.outputs
        self.provider, self.precision, self.device, self.compile_s = inner.provider, inner.precision, None, 0.0
        self.entered = threading.Event()
        self.gate = threading.Event()
        self.closed = threading.Event()

    def run(self, feeds, output_names=None):
        self.entered.set()
        if not self.gate.wait(30):
            raise RuntimeError("gate never opened")
        return self.inner.run(feeds, output_names)

    def assignment(self):
        return self.inner.assignment()

    def close(self):
        self.closed.set()
        self.inner.close()


def x4(value: float = 0.0) -> dict[str, np.ndarray]:
    return {"x": np.full((1, 4), value, dtype=np.float32)}


@contextlib.contextmanager
def oip_server(sessions, **server_kw) -> Iterator:
    """The one test server: an OIPServer on a free loopback port over a fresh registry serving `sessions`
    ((name, version, session[, meta]) each); `server_kw` go to OIPServer (token, max_body_bytes, ...). The server
    drains and the registry closes afterwards."""
    from agent.serving.http.server import OIPServer
    from agent.serving.registry import ModelRegistry

    reg = ModelRegistry()
    for name, version, session, *meta in sessions:
        reg.activate(name, version, session, *meta)
    srv = OIPServer(reg, port=0, **server_kw).start()
    try:
        yield srv
    finally:
        assert srv.shutdown(10)
        reg.close()


def call_json(url: str, doc: dict | None = None, method: str = "POST", timeout: float = 60) -> tuple[int, dict]:
    """One JSON request to the server: (status, decoded body), an error status with its body too."""
    data = json.dumps(doc).encode() if doc is not None else None
    req = urllib.request.Request(url, data=data, method=method)
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())
