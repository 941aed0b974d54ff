"""Generative models on the inference port: the engine interface (engine.py) and one engine a runtime
(ortgenai.py: onnxruntime-genai; ovgenai.py: OpenVINO GenAI's LLMPipeline) under a KV-memory budget (kvbudget.py),
answered as OpenAI-compatible completions with SSE streaming (openai.py); docs/generative.md."""
