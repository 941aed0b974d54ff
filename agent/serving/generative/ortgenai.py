"""A generative model served by onnxruntime-genai (og.Model, one og.Generator per request: generations run at once,
each with its own KV cache): tokenizer, KV shape from genai_config.json, and a generation as an iterator of text
pieces. Closing the iterator (a client that hung up) ends the generation and frees its KV budget at once."""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from pathlib import Path
from typing import Any

import numpy as np

from agent.serving.errors import ModelUnavailable
from agent.serving.generative.engine import ORT_GENAI, GenerativeModel, Sampling, StopScanner, Usage
from agent.serving.generative.kvbudget import KVBudget, Lease, kv_shape
from agent.serving.generative.pacing import Pacer


class OrtGenaiModel(GenerativeModel):
    runtime = ORT_GENAI

    def __init__(self, name: str, model_dir: Path, provider: str, budget: KVBudget, version: str = "1") -> None:
        try:
            import onnxruntime_genai as og
        except ImportError as exc:
            raise ModelUnavailable(
                f"{name}: onnxruntime-genai is not installed (pip install 'edge-agent[genai]')"
            ) from exc
        super().__init__(name, model_dir, provider, budget, version)
        self.og: Any = og
        cfg = og.Config(str(model_dir))
        cfg.clear_providers()
        if provider != "cpu":
            cfg.append_provider(provider)
        self.model = og.Model(cfg)
        self.tokenizer = og.Tokenizer(self.model)
        self.kv = kv_shape(model_dir)
        eos = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"].get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [eos])

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def _generator(self, prompt: list[int], sampling: Sampling) -> Any:
        params = self.og.GeneratorParams(self.model)
        greedy = sampling.temperature <= 0
        opts: dict[str, Any] = {"max_length": min(self.kv.max_length, len(prompt) + sampling.max_tokens)}
        opts.update(
            {"do_sample": False}
            if greedy
            else {"do_sample": True, "temperature": sampling.temperature, "top_p": sampling.top_p, "top_k": 0}
        )
        params.set_search_options(**opts)
        gen = self.og.Generator(self.model, params)
        gen.append_tokens(prompt)
        return gen

    def generate(
        self, prompt: list[int], sampling: Sampling, usage: Usage, lease: Lease, streamed: bool = True
    ) -> Generator[str, None, None]:
        """Generated on the request's own thread, a piece a token (streamed or not: stream_interval_ms is for
        engines that generate on a thread of their own, where each piece costs a hop: ovgenai)."""
        usage.prompt_tokens = len(prompt)
        self.recent.add(prompt)
        try:
            t0 = last = time.perf_counter()  # TTFT counts the prefill (append_tokens) too
            gen = self._generator(prompt, sampling)
            stream = self.tokenizer.create_stream()
            scan = StopScanner(sampling.stop)
            pace = Pacer(self.stream_interval_s if streamed else 0.0)
            while not gen.is_done() and usage.completion_tokens < sampling.max_tokens:
                gen.generate_next_token()
                token = int(gen.get_next_tokens()[0])
                now = time.perf_counter()
                if usage.ttft_s is None:
                    usage.ttft_s = now - t0
                else:
                    usage.pieces.append(now - last)
                last = now
                if token in self.eos:
                    usage.finish_reason = "stop"
                    break
                usage.completion_tokens += 1
                out, stopped = scan.feed(stream.decode(token))
                yield pace.take(out)  # "" when the token ends no character yet or the interval runs
                if stopped:
                    usage.finish_reason = "stop"
                    yield pace.rest()
                    return
            usage.finish_reason = usage.finish_reason or "length"
            tail = pace.rest() + scan.rest()
            if tail:
                yield tail
        finally:
            self.ended(prompt, sampling, usage, lease)

    def _greedy(self, length: int, min_length: int = 0) -> Any:
        params = self.og.GeneratorParams(self.model)
        params.set_search_options(max_length=length, min_length=min_length, do_sample=False)
        return self.og.Generator(self.model, params)

    def continuation(self, prompt: list[int], tokens: int) -> list[int]:
        total = len(prompt) + tokens
        gen = self._greedy(total, total)
        gen.append_tokens(prompt)
        out = list(prompt)
        while not gen.is_done():
            gen.generate_next_token()
            out.append(int(gen.get_next_tokens()[0]))
        return out

    def teacher_logits(self, seq: list[int]) -> np.ndarray:
        gen = self._greedy(len(seq))
        gen.append_tokens(seq)
        logits: np.ndarray = np.asarray(gen.get_output("logits"), dtype=np.float32)[0]
        return logits

    def paired_tpot(self, prompt: list[int], warm: int, tokens: int, cpu: bool) -> float | None:
        from agent.serving.rungate import CpuMark

        total = len(prompt) + warm + tokens
        gen = self._greedy(total, total)
        gen.append_tokens(prompt)
        for _ in range(1 + warm):  # prefill and the first token (TTFT, not TPOT), then the warm tokens
            gen.generate_next_token()
        mark = CpuMark(self, own_only=True) if cpu else None  # its intra-op pool is claimed at load
        t1, steps = time.perf_counter(), 0
        while not gen.is_done():
            gen.generate_next_token()
            steps += 1
        spent = mark.spent() if mark is not None else time.perf_counter() - t1
        if steps == 0 or (mark is not None and mark.contended):
            return None
        return spent / steps
