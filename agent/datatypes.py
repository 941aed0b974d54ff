"""The Open Inference Protocol's tensor datatypes and the numpy dtype each travels as: one table for the server
(agent.serving.codec) and for qualification's "can OIP carry this output" check (agent.qualify.outputs)."""

from __future__ import annotations

# KServe v2 datatype -> numpy dtype name. BYTES travels as an object array of str: ONNX string tensors
# hold text and onnxruntime's Python binding str()s bytes objects, so elements must be UTF-8.
DATATYPES: dict[str, str] = {
    "BOOL": "bool",
    "UINT8": "uint8",
    "UINT16": "uint16",
    "UINT32": "uint32",
    "UINT64": "uint64",
    "INT8": "int8",
    "INT16": "int16",
    "INT32": "int32",
    "INT64": "int64",
    "FP16": "float16",
    "FP32": "float32",
    "FP64": "float64",
    "BYTES": "object",
    "BF16": "bfloat16",
}
