"""Qualification test helpers: the hardware profile the harness tests qualify on, a model only ONNX Runtime runs."""

from __future__ import annotations

from typing import Any

from agent.hardware.profile import CpuInfo, HardwareProfile

# An x86_64 CPU class with avx512_bf16, where OpenVINO defaults to bf16 and f32 is offered (the profile only
# decides which rows are planned: every row runs on this host's real runtimes).
BF16_X86 = HardwareProfile(
    arch="x86_64",
    os="Linux",
    cpu=CpuInfo(vendor="AuthenticAMD", model="test", cores=2, flags=("avx2", "avx512f", "avx512_bf16")),
)


def contrib_gelu() -> Any:
    """com.microsoft Gelu: ONNX Runtime runs it, onnx's reference evaluator has no implementation."""
    from onnx import TensorProto, helper

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [2, 8])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, [2, 8])
    node = helper.make_node("Gelu", ["x"], ["y"], domain="com.microsoft")
    model = helper.make_model(
        helper.make_graph([node], "gelu", [x], [y]),
        opset_imports=[helper.make_opsetid("", 17), helper.make_opsetid("com.microsoft", 1)],
    )
    model.ir_version = 8
    return model
