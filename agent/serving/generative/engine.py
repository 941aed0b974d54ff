"""The engine interface of a served generative model (docs/generative.md, "Serving"): what every runtime's engine
shares (the KV-budget reservation, metrics, the live-prompt ring, the observers of a trial, the stop-string scan)
and what each implements: encode, generate (an iterator of text pieces: closing it, a client that hung up, ends
the generation and frees its KV budget), and the trial's runs (continuation, teacher_logits, paired_tpot). One
runtime per module: agent.serving.generative.ortgenai (onnxruntime-genai), .ovgenai (OpenVINO GenAI's LLMPipeline);
host.load_engine picks one by the package's model.yaml runtime."""

from __future__ import annotations

import time
from collections.abc import Generator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from agent.serving.errors import InvalidInput, ServerBusy
from agent.serving.generative.genmetrics import GenStats
from agent.serving.generative.kvbudget import KVBudget, KVShape, Lease
from agent.serving.generative.pacing import DEFAULT_STREAM_INTERVAL_S
from agent.serving.generative.recent import LivePrompts

ORT_GENAI, OV_GENAI = "onnxruntime-genai", "openvino-genai"


@dataclass(frozen=True)
class EngineSpec:
    """How a model directory is served: its package's runtime, the row's precision (openvino-genai: `device-default`
    compiles with the device's own hints, anything else with f32 ones) and the package's max_length (openvino-genai:
    the longest sequence a request may reach; onnxruntime-genai reads it from genai_config.json). `pair_copy`: a
    copy for a trial's paired TPOT only (GenerativeHost.copy), never served (openvino-genai: one inference thread)."""

    runtime: str = ORT_GENAI
    precision: str | None = None
    max_length: int | None = None
    pair_copy: bool = False


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
    """What the routes, the host and the trial see of a served generative model; a runtime's engine subclasses it
    and sets `kv` (the KV cost of a token) and `eos` in its __init__."""

    runtime = ""
    spec = EngineSpec()  # how it was loaded (ovgenai sets its own)
    # the runtime's pipelines of one process share a CPU thread pool (openvino-genai): a trial times both
    # versions on pair copies (GenerativeHost.copy), not only the serving one
    shared_pool = False
    kv: KVShape
    eos: set[int]
    stream_interval_s = DEFAULT_STREAM_INTERVAL_S  # the host sets serving.generative.stream_interval_ms

    def __init__(self, name: str, model_dir: Path, provider: str, budget: KVBudget, version: str = "1") -> None:
        self.name, self.model_dir, self.provider, self.budget = name, model_dir, provider, budget
        self.version = str(version)
        # offered each generation that ran to its end (a trial's pairing, agent.trial.genpaired): cheap, never raise
        self.observers: list[Any] = []
        self.created = int(time.time())
        self.stats = GenStats(name, budget=lambda: self.budget)
        self.recent = LivePrompts()  # copies of the last live prompts: the next version's shadow (genshadow)

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

    def ended(self, prompt: list[int], sampling: Sampling, usage: Usage, lease: Lease) -> None:
        """A generation ended (ran out, stopped, or was closed: its client went away): its lease back, its figures
        recorded, the trial's observers offered its prompt when it ran to its end."""
        lease.release()
        cancelled = usage.finish_reason is None  # closed before it ended: the client went away
        self.stats.record(usage.prompt_tokens, usage.completion_tokens, usage.ttft_s, usage.pieces, cancelled)
        if not cancelled:
            for observer in self.observers:
                observer.offer_prompt(prompt, sampling.max_tokens)

    def close(self) -> None:
        """A copy nobody serves from (a pairing's twin): its runtime threads are no longer claimed; the runtime's
        objects go with the last reference."""
        from agent.serving import rungate

        rungate.disown(self)

    # what each runtime implements
    def encode(self, text: str) -> list[int]:
        raise NotImplementedError

    def generate(
        self, prompt: list[int], sampling: Sampling, usage: Usage, lease: Lease, streamed: bool = True
    ) -> Generator[str, None, None]:
        """Text pieces as tokens come ("" for a token that ends no character yet); usage filled as it goes; ended()
        when it ends or is closed (one closed before it started never runs: its caller releases the lease).
        `streamed` False: the caller reads the text only at its end (an engine may then give it in one piece)."""
        raise NotImplementedError

    def continuation(self, prompt: list[int], tokens: int) -> list[int]:
        """`prompt` and this model's greedy continuation of exactly `tokens` tokens (EOS suppressed)."""
        raise NotImplementedError

    def teacher_logits(self, seq: list[int]) -> np.ndarray:
        """The logits [len(seq), vocab] at every position of `seq`, teacher-forced."""
        raise NotImplementedError

    def paired_tpot(self, prompt: list[int], warm: int, tokens: int, cpu: bool) -> float | None:
        """Seconds per output token over `tokens` greedy tokens after the prefill's and `warm` more (EOS
        suppressed); CPU time (rungate.CpuMark) when `cpu`, else wall; None when its threads waited for the cores."""
        raise NotImplementedError
