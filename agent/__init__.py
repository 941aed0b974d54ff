"""edge-agent: deploy ONNX models to edge devices and prove they run correctly and fast before they serve.

Importing this package must stay cheap: it never imports onnxruntime, openvino or paho.
"""

__version__ = "0.1.0"
