"""One generative model served by onnxruntime-genai: tokenizer, KV shape, and a generation as an iterator of text
pieces. Closing the iterator (a client that hung up) ends the generation and frees its KV budget at once."""

from __future__ import annotations

import json
import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.serving.errors import InvalidInput, ModelUnavailable, ServerBusy
from agent.serving.generative.genmetrics import GenStats
from agent.serving.generative.kvbudget import KVBudget, Lease, kv_shape
from agent.serving.generative.recent import LivePrompts


@dataclass(frozen=True)
class Sampling:
    max_tokens: int = 16
    temperature: float = 1.0
    top_p: float = 1.0
    stop: tuple[str, ...] = ()


@dataclass
class Usage:
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft_s: float | None = None
    finish_reason: str | None = None
    pieces: list[float] = field(default_factory=list)  # seconds per later token


class StopScanner:
    """Text out of a token stream with `stop` strings cut: holds back what could still start a stop string."""

    def __init__(self, stop: tuple[str, ...]) -> None:
        self.stop = tuple(s for s in stop if s)
        self.hold = max((len(s) for s in self.stop), default=1) - 1
        self.text = ""
        self.sent = 0

    def feed(self, piece: str) -> tuple[str, bool]:
        """(text that may go out now, whether a stop string ended the completion)."""
        self.text += piece
        hits = [i for i in (self.text.find(s, max(0, self.sent - self.hold)) for s in self.stop) if i >= 0]
        if hits:
            end = min(hits)
            out, self.sent = self.text[self.sent : end], end
            return out, True
        upto = max(self.sent, len(self.text) - self.hold)
        out, self.sent = self.text[self.sent : upto], upto
        return out, False

    def rest(self) -> str:
        out, self.sent = self.text[self.sent :], len(self.text)
        return out


class GenerativeModel:
    def __init__(self, name: str, model_dir: Path, provider: str, budget: KVBudget, version: str = "1") -> None:
        try:
            import onnxruntime_genai as og
        except ImportError as exc:
            raise ModelUnavailable(
                f"{name}: onnxruntime-genai is not installed (pip install 'edge-agent[genai]')"
            ) from exc
        self.og: Any = og
        self.name, self.model_dir, self.provider, self.budget = name, model_dir, provider, budget
        self.version = str(version)
        # offered each generation that ran to its end (a trial's pairing, agent.trial.genpaired): cheap, never raise
        self.observers: list[Any] = []
        cfg = og.Config(str(model_dir))
        cfg.clear_providers()
        if provider != "cpu":
            cfg.append_provider(provider)
        self.model = og.Model(cfg)
        self.tokenizer = og.Tokenizer(self.model)
        self.kv = kv_shape(model_dir)
        self.created = int(time.time())
        self.stats = GenStats(name, budget=lambda: self.budget)
        self.recent = LivePrompts()  # copies of the last live prompts: the next version's shadow (genshadow)
        eos = json.loads((model_dir / "genai_config.json").read_text(encoding="utf-8"))["model"].get("eos_token_id")
        self.eos = set(eos if isinstance(eos, list) else [eos])

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def reserve(self, prompt: list[int], sampling: Sampling) -> Lease:
        """Bytes of KV budget this request holds (ServerBusy when it cannot fit); InvalidInput when it never could."""
        if len(prompt) >= self.kv.max_length:
            raise InvalidInput(f"the prompt has {len(prompt)} tokens; {self.name} holds at most {self.kv.max_length}")
        need = self.kv.bytes_for(len(prompt) + sampling.max_tokens)
        if need > self.budget.limit:
            raise InvalidInput(
                f"this request needs {need} bytes of KV cache, over the whole budget {self.budget.limit}"
            )
        try:
            lease = self.budget.lease(need, f"a {len(prompt)}-token prompt with max_tokens {sampling.max_tokens}")
        except ServerBusy:
            self.stats.refused()
            raise
        self.stats.reserved(need)
        return lease

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

    def generate(self, prompt: list[int], sampling: Sampling, usage: Usage, lease: Lease) -> Generator[str, None, None]:
        """Text pieces as tokens come; usage filled as it goes. Releases `lease` when it ends or is closed (one
        closed before it started never runs: its caller releases the lease too, agent.serving.generative.stream)."""
        usage.prompt_tokens = len(prompt)
        self.recent.add(prompt)
        try:
            t0 = last = time.perf_counter()  # TTFT counts the prefill (append_tokens) too
            gen = self._generator(prompt, sampling)
            stream = self.tokenizer.create_stream()
            scan = StopScanner(sampling.stop)
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
                yield out  # "" when the token ends no character yet (the stream still checks its client)
                if stopped:
                    usage.finish_reason = "stop"
                    return
            usage.finish_reason = usage.finish_reason or "length"
            tail = scan.rest()
            if tail:
                yield tail
        finally:
            lease.release()
            cancelled = usage.finish_reason is None  # closed before it ended: the client went away
            self.stats.record(usage.prompt_tokens, usage.completion_tokens, usage.ttft_s, usage.pieces, cancelled)
            if not cancelled:
                for observer in self.observers:
                    observer.offer_prompt(prompt, sampling.max_tokens)
