"""A generative package made in code: the tiny decoder (agent.generative.tinymodel) as the fp32 reference, plus
optional variants: `int8` (ONNX Runtime's dynamic quantisation of its MatMul weights), `perturbed` (the same
weights with relative Gaussian noise: a variant that must fall under the fidelity floor) and `gqa` (the same weights
through GroupQueryAttention with a KV buffer allocated at max_length). write_openvino_package: the same decoder for
OpenVINO GenAI (runtime: openvino-genai)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any

from agent.generative.tinymodel import write_tiny_genai

PROMPTS = [
    "The quick brown fox jumps over the lazy dog.",
    "Edge devices measure, they do not assume.",
    "Once upon a time, in a small town,",
]
SIDE_FILES = ("genai_config.json", "tokenizer.json", "tokenizer_config.json")


def _int8(src: Path, dst: Path) -> None:
    from onnxruntime.quantization import QuantType, quantize_dynamic

    dst.mkdir(parents=True, exist_ok=True)
    quantize_dynamic(
        str(src / "model.onnx"), str(dst / "model.onnx"), weight_type=QuantType.QInt8, op_types_to_quantize=["MatMul"]
    )
    for name in SIDE_FILES:
        shutil.copyfile(src / name, dst / name)


def _int4(src: Path, dst: Path, block_size: int = 32) -> None:
    """The decoder's constant-weight MatMuls as MatMulNBits (4 bits, symmetric, `block_size` weights a scale):
    onnxruntime's own MatMulNBitsQuantizer, what its model builder's int4 models run."""
    import logging

    import onnx
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    logging.getLogger("onnxruntime.quantization.matmul_nbits_quantizer").setLevel(logging.WARNING)
    quantizer = MatMulNBitsQuantizer(onnx.load(str(src / "model.onnx")), block_size=block_size, is_symmetric=True)
    quantizer.process()
    dst.mkdir(parents=True, exist_ok=True)
    quantizer.model.save_model_to_file(str(dst / "model.onnx"))
    for name in SIDE_FILES:
        shutil.copyfile(src / name, dst / name)


def _yaml(name: str, version: str, max_length: int, variants: dict[str, str], runtime: str) -> str:
    lines = [
        f"name: {name}",
        f"version: {version!r}",
        "kind: generative",
        f"runtime: {runtime}",
        f"max_length: {max_length}",
        "prompts:",
    ]
    lines += [f"  - {p!r}" for p in PROMPTS]
    if variants:
        lines.append("variants:")
        lines += [f"  {k}: {v}" for k, v in variants.items()]
    return "\n".join(lines) + "\n"


def write_generative_package(
    directory: Path,
    *,
    variants: tuple[str, ...] = ("int8",),
    max_length: int = 256,
    perturb: float = 0.2,
    name: str = "tiny-lm",
    version: str = "1",
    timing: dict[str, Any] | None = None,
    **shape: int,
) -> Path:
    """Write the package into `directory`; variants from ("int8", "int4", "perturbed", "gqa"); `shape`: the decoder's
    layers, hidden, heads, seed (agent.generative.tinymodel.Tiny; default 2 layers of 32, seed 0); `timing`: model.yaml's."""
    directory = Path(directory)
    write_tiny_genai(directory, max_length=max_length, **shape)
    written: dict[str, str] = {}
    for v in variants:
        if v == "int8":
            _int8(directory, directory / "int8")
        elif v == "int4":
            _int4(directory, directory / "int4")
        elif v == "perturbed":
            write_tiny_genai(directory / "perturbed", max_length=max_length, perturb=perturb, **shape)
        elif v == "gqa":
            write_tiny_genai(directory / "gqa", max_length=max_length, gqa=True, **shape)
        else:
            raise ValueError(f"unknown variant {v!r} (int8, int4, perturbed, gqa)")
        written[v] = v
    text = _yaml(name, version, max_length, written, "onnxruntime-genai") + (
        f"timing: {json.dumps(timing)}\n" if timing else ""
    )
    (directory / "model.yaml").write_text(text, encoding="utf-8")
    return directory


def write_openvino_package(
    directory: Path,
    *,
    variants: tuple[str, ...] = ("perturbed",),
    max_length: int = 256,
    perturb: float = 0.2,
    name: str = "tiny-lm",
    version: str = "1",
    timing: dict[str, Any] | None = None,
    **shape: int,
) -> Path:
    """The same package for runtime openvino-genai: the same decoder (the same weights for the same `shape` and
    seed) in OpenVINO GenAI's layout (agent.generative.tinyov); variants from ("perturbed",)."""
    from agent.generative.tinyov import write_tiny_openvino

    directory = Path(directory)
    write_tiny_openvino(directory, max_length=max_length, **shape)
    for v in variants:
        if v != "perturbed":
            raise ValueError(f"unknown variant {v!r} for openvino-genai (perturbed)")
        write_tiny_openvino(directory / v, max_length=max_length, perturb=perturb, **shape)
    text = _yaml(name, version, max_length, {v: v for v in variants}, "openvino-genai")
    text += f"timing: {json.dumps(timing)}\n" if timing else ""
    (directory / "model.yaml").write_text(text, encoding="utf-8")
    return directory
