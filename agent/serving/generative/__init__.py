"""Generative models on the inference port: onnxruntime-genai generation (engine.py) under a KV-memory budget
(kvbudget.py), answered as OpenAI-compatible completions with SSE streaming (openai.py); docs/generative.md."""
