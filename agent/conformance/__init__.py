"""Hardware conformance: the ONNX node suite and the models suite on every provider, with reports."""
