"""Model packages: directory, .tar.gz (safe extraction), bare .onnx, checker rejection, model.yaml validation."""

from __future__ import annotations

import hashlib
import io
import tarfile

import onnx
import pytest
from onnx import TensorProto, helper

from agent import samples
from agent.errors import ModelError
from agent.package.inputs import package_inputs
from agent.package.load import load_package
from agent.package.seeded import seeded_feeds


def test_directory_package(cnn_package):
    pkg = load_package(cnn_package)
    assert pkg.name == "sample-cnn" and pkg.version == "1" and pkg.task == "classification"
    assert pkg.sha256 == hashlib.sha256((cnn_package / "model.onnx").read_bytes()).hexdigest()
    assert [d.name for d in pkg.datasets] == ["test_data_set_0"]
    assert pkg.inputs[0].shape == ("batch", 3, 32, 32)
    d = pkg.to_dict()
    assert {"sha256", "name", "version", "path"} <= set(d)
    feeds, golden, desc = package_inputs(pkg)
    assert desc == "golden:test_data_set_0"
    assert feeds["input"].shape == (1, 3, 32, 32) and golden["probabilities"].shape == (1, 10)


def test_targz_with_top_dir(cnn_package, tmp_path):
    archive = tmp_path / "cnn.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        tar.add(cnn_package, arcname="cnn")
    pkg = load_package(archive, extract_to=tmp_path / "x")
    assert pkg.root == tmp_path / "x" / "cnn"
    assert pkg.name == "sample-cnn" and pkg.datasets


def test_bare_onnx(tmp_path):
    path = tmp_path / "tiny.onnx"
    onnx.save(samples.tiny_model(2.0), path)
    pkg = load_package(path)
    assert pkg.name == "tiny" and pkg.datasets == [] and pkg.version == "0"
    feeds, golden, desc = package_inputs(pkg)
    assert golden is None and desc.startswith("seeded") and feeds["x"].shape == (1, 4)


def _tar_with(tmp_path, name: str, *, link: str | None = None, data: bytes = b"x") -> str:
    archive = tmp_path / "evil.tar.gz"
    with tarfile.open(archive, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        if link is not None:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
        else:
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return archive


@pytest.mark.parametrize(
    "name,link,needle",
    [
        ("../escape.onnx", None, "escapes the package"),
        ("/abs/model.onnx", None, "escapes the package"),
        ("pkg/model.onnx", "../../etc/passwd", "points outside"),
        ("pkg/model.onnx", "/etc/passwd", "points outside"),
    ],
)
def test_unsafe_archives_rejected(tmp_path, name, link, needle):
    archive = _tar_with(tmp_path, name, link=link)
    with pytest.raises(ModelError, match=needle):
        load_package(archive, extract_to=tmp_path / "out")
    assert not (tmp_path / "escape.onnx").exists()


def test_archive_size_limit(tmp_path):
    archive = _tar_with(tmp_path, "model.onnx", data=b"0" * 4096)
    with pytest.raises(ModelError, match="size limit"):
        load_package(archive, extract_to=tmp_path / "out", max_bytes=1024)


def test_corrupt_and_missing(tmp_path):
    bad = tmp_path / "bad.onnx"
    bad.write_bytes(b"\x08\x07garbage that is not protobuf\xff\xff")
    with pytest.raises(ModelError, match="not a valid ONNX model"):
        load_package(bad)
    with pytest.raises(ModelError, match="not found"):
        load_package(tmp_path / "nope")
    (tmp_path / "empty").mkdir()
    with pytest.raises(ModelError, match="no model.onnx"):
        load_package(tmp_path / "empty")
    truncated = tmp_path / "t.tar.gz"
    truncated.write_bytes(b"\x1f\x8b\x08\x00broken")
    with pytest.raises(ModelError, match="cannot extract"):
        load_package(truncated, extract_to=tmp_path / "o")


def test_checker_reason_is_carried(tmp_path):
    graph = helper.make_graph(
        [helper.make_node("Relu", ["undefined_input"], ["y"])],
        "g",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1])],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    path = tmp_path / "broken.onnx"
    path.write_bytes(model.SerializeToString())
    with pytest.raises(ModelError, match="rejected by the ONNX checker.*undefined_input"):
        load_package(path)


def test_shape_inference_failure_rejected(tmp_path):
    # Add of [2] and [3] cannot broadcast: strict shape inference refuses it.
    graph = helper.make_graph(
        [helper.make_node("Add", ["a", "b"], ["y"])],
        "g",
        [
            helper.make_tensor_value_info("a", TensorProto.FLOAT, [2]),
            helper.make_tensor_value_info("b", TensorProto.FLOAT, [3]),
        ],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)],
    )
    path = tmp_path / "shapes.onnx"
    path.write_bytes(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]).SerializeToString())
    with pytest.raises(ModelError, match="checker"):
        load_package(path)


@pytest.mark.parametrize(
    "yaml_text,needle",
    [
        ("name: x\nbogus: 1\n", "bogus: unknown key"),
        ("name: x\ndynamic_dims: {batch: 0}\n", "dynamic_dims.batch"),
        ("name: x\ntolerances: {max_rel: fast}\n", "tolerances.max_rel"),
        ("name: x\ntolerances: {openvino: {max_rel: -1}}\n", "tolerances.openvino.max_rel"),
        ("name: x\ntolerances: {openvino: {wobble: 1}}\n", "tolerances.openvino.wobble"),
        ("- a list\n", "mapping"),
        ("name: [unclosed\n", "invalid YAML"),
    ],
)
def test_model_yaml_errors_name_the_key(cnn_package, yaml_text, needle):
    (cnn_package / "model.yaml").write_text(yaml_text)
    with pytest.raises(ModelError, match=needle.replace("[", r"\[")):
        load_package(cnn_package)


def test_model_yaml_dynamic_dims_and_tolerances(tmp_path):
    d = samples.write_package(
        tmp_path / "p",
        samples.cnn_model(),
        name="c",
        golden=False,
        extra_yaml={
            "dynamic_dims": {"batch": 3},
            "tolerances": {"max_rel": 0.5, "openvino:bf16": {"max_rel": 0.1}},
            "required_providers": ["cpu"],
        },
    )
    pkg = load_package(d)
    feeds, golden, desc = package_inputs(pkg)
    assert feeds["input"].shape == (3, 3, 32, 32) and golden is None and "batch=3" in desc
    assert pkg.tolerance_override("cpu", None) == {"max_rel": 0.5}
    assert pkg.tolerance_override("openvino", "bf16") == {"max_rel": 0.1}
    assert pkg.required_providers == ["cpu"]


def test_seeded_feeds_are_deterministic_and_typed():
    from agent.providers.base import TensorSpec

    specs = [TensorSpec("f", "float16", (2, "n")), TensorSpec("i", "int64", (4,)), TensorSpec("b", "bool", (3,))]
    a = seeded_feeds(specs, dynamic_dims={"n": 5})
    b = seeded_feeds(specs, dynamic_dims={"n": 5})
    assert a["f"].dtype.name == "float16" and a["f"].shape == (2, 5)
    assert a["i"].dtype.name == "int64" and a["b"].dtype == bool
    assert all((a[k] == b[k]).all() for k in a)


def test_content_addressed_blobs_are_sniffed(cnn_package, tmp_path):
    blob_tar = tmp_path / "blobs" / ("a" * 64)
    blob_tar.parent.mkdir()
    with tarfile.open(blob_tar, "w:gz") as tar:
        tar.add(cnn_package, arcname=".")
    assert load_package(blob_tar, extract_to=tmp_path / "x").name == "sample-cnn"
    blob_onnx = tmp_path / "blobs" / ("b" * 64)
    blob_onnx.write_bytes((cnn_package / "model.onnx").read_bytes())
    pkg = load_package(blob_onnx)
    assert pkg.sha256 == hashlib.sha256(blob_onnx.read_bytes()).hexdigest() and pkg.inputs[0].name == "input"
