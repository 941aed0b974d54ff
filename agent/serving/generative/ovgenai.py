"""A generative model served by OpenVINO GenAI's LLMPipeline (docs/generative.md, "Serving"), the engine interface
of agent.serving.generative.engine. LLMPipeline.generate blocks until the generation ends and hands tokens to a
streamer callback (on a thread of its own), so a generation runs on a thread of ours: the streamer only stamps each
token and queues its id; the request's iterator reads the queue, decodes the text and cuts stop strings (the
detokenizer kept off the generation's path: _Run). Closing the iterator (a client that hung up) or a stop string
sets a flag the streamer answers with StreamingStatus.STOP at the next token; the lease is released once
the generation has returned. One LLMPipeline runs one generate at a time (a second at once fails:
`!has_non_finished_requests()`, openvino.genai#2480) and each further copy costs about twice the weights here, so
a model serves one generation at a time: the others, admitted by the KV budget, wait in line for it (sending SSE
keep-alives, so one whose client left is dropped without running).

Compiled with the qualification row's hints (agent.generative.ovrow.HINTS: `device-default` the device's own,
anything else f32). The KV cost of a token is read from the IR's state variables (ReadValue `variable_shape`,
[batch, kv_heads, seq, head_size]) at 4 bytes an element; the longest sequence is the package's max_length."""

from __future__ import annotations

import queue
import threading
import time
import xml.etree.ElementTree as ET  # the package's own IR, checked (and verified, when deployed) before it loads
from collections.abc import Callable, Generator
from pathlib import Path
from typing import Any

import numpy as np

from agent.serving.errors import ModelUnavailable
from agent.serving.generative.engine import OV_GENAI, EngineSpec, GenerativeModel, Sampling, StopScanner, Usage
from agent.serving.generative.kvbudget import KVBudget, KVShape, Lease
from agent.serving.generative.ovlending import Pipelines
from agent.serving.generative.pacing import Pacer
from agent.serving.generative.params import KEEPALIVE_S

DEVICE_DEFAULT = "device-default"  # agent.generative.qualify's row of the device's own hints
_DONE = object()


def ov_kv_shape(model_dir: Path, max_length: int, dtype_bytes: int = 4) -> KVShape:
    """The KV cost of a token from the stateful IR's ReadValue variables (keys and values of each layer)."""
    shapes = []
    for _, el in ET.iterparse(model_dir / "openvino_model.xml"):
        if el.tag == "layer" and el.get("type") == "ReadValue":
            data = el.find("data")
            dims = (data.get("variable_shape") or "") if data is not None else ""
            parts = dims.split(",")
            if len(parts) == 4 and parts[1].strip().isdigit() and parts[3].strip().isdigit():
                shapes.append((int(parts[1]), int(parts[3])))
        if el.tag == "layer":
            el.clear()
    if not shapes:
        raise ModelUnavailable(f"{model_dir}: the IR has no KV state (ReadValue [batch, heads, seq, head_size])")
    heads, size = max(h for h, _ in shapes), max(s for _, s in shapes)
    return KVShape((len(shapes) + 1) // 2, heads, size, dtype_bytes, int(max_length), False)


class _Text:
    """Text of a token stream as it grows: a piece goes out once it decodes to whole characters (a byte-level
    token that ends inside a character gives "" until the character is whole). Each piece is the decode of the
    tokens since the last piece, read after the tokens of that piece (context for tokenizers that drop a word's
    leading space at the start); one detokenizer call for each add (about 0.1 ms here, however many tokens it
    adds): what the last piece was is taken as the decode of its own tokens, and decoded for real only where the
    next decode does not start with it."""

    def __init__(self, decode: Callable[[list[int]], str]) -> None:
        self.decode, self.start, self.read = decode, 0, 0
        self.ids: list[int] = []
        self.before, self.exact = "", True  # decode(ids[start:read]), or the piece that was sent for them

    def _window(self) -> str:
        after = self.decode(self.ids[self.start :])
        if not self.exact and not after.startswith(self.before):
            self.before, self.exact = self.decode(self.ids[self.start : self.read]), True
        return after

    def add(self, tokens: list[int]) -> str:
        self.ids.extend(tokens)
        after = self._window()
        if after.endswith("\ufffd") or len(after) <= len(self.before) or not after.startswith(self.before):
            return ""
        piece = after[len(self.before) :]
        self.start, self.read, self.before, self.exact = self.read, len(self.ids), piece, False
        return piece

    def rest(self) -> str:
        if len(self.ids) == self.read:
            return ""
        after = self._window()
        return after[len(self.before) :] if after.startswith(self.before) else after


class _Run:
    """One generation on a thread of its own. The generation thread's streamer only stamps each token and queues
    its id (an exception, then _DONE, when the pipeline failed); the request's thread decodes and scans for stop
    strings, off the generation's path: a stream at most every stream_interval (pacing.Pacer: the tokens that
    came meanwhile decoded at once; token by token where a stop string must be found at its token); a generation
    read only at its end (not streamed, no stop string) runs with no streamer and is decoded once. `cancel` (its
    client went away, or its text reached a stop string) stops the generation at its next token."""

    def __init__(
        self, model: OVGenaiModel, prompt: list[int], sampling: Sampling, usage: Usage, streamed: bool
    ) -> None:
        self.model, self.prompt, self.sampling, self.usage = model, prompt, sampling, usage
        self.q: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.cancel = threading.Event()
        self.text = _Text(model.decode)
        self.scan = StopScanner(sampling.stop)
        self.whole = not streamed and not self.scan.stop
        self.pace = Pacer(model.stream_interval_s if streamed else 0.0)
        self.t0 = self.last = 0.0
        self.eos = False  # the model ended the text (set by the generation thread before _DONE)
        self.finished = threading.Event()  # the generation returned: a paced stream's last piece goes out at once
        self.thread = threading.Thread(target=self._produce, name=f"ovgenai-{model.name}", daemon=True)

    def _config(self, pipe: Any) -> Any:
        cfg = pipe.get_generation_config()
        cfg.max_new_tokens = max(1, min(self.sampling.max_tokens, self.model.kv.max_length - len(self.prompt)))
        cfg.ignore_eos = False
        cfg.do_sample = self.sampling.temperature > 0  # temperature 0: greedy
        if cfg.do_sample:
            cfg.temperature, cfg.top_p = self.sampling.temperature, self.sampling.top_p
            cfg.rng_seed = int.from_bytes(np.random.default_rng().bytes(4), "little")
        return cfg

    def _produce(self) -> None:
        try:
            with self.model.pipelines.borrow(self.cancel) as pipe:
                if pipe is None:
                    return  # its client went away while it waited for the pipeline
                self.t0 = self.last = time.perf_counter()  # TTFT counts the prefill too
                if self.whole:
                    self._generate_whole(pipe)
                else:
                    pipe.generate(self.model.ids(self.prompt), self._config(pipe), self.model.streamer(self))
        except BaseException as exc:  # noqa: BLE001 - the request's own thread raises it
            self.q.put(exc)
        finally:
            self.q.put(_DONE)
            self.finished.set()

    def _generate_whole(self, pipe: Any) -> None:
        """A generation read only at its end: no streamer (nothing runs in Python between its tokens); its token
        times are the pipeline's own (perf_metrics.raw_metrics, microseconds: the time to the first token and
        each later token's, EOS's included) and its tokens go to the request's thread at once."""
        res = pipe.generate(self.model.ids(self.prompt), self._config(pipe))
        tokens = [int(t) for t in res.tokens[0]]
        raw, usage = res.perf_metrics.raw_metrics, self.usage
        first = list(raw.m_times_to_first_token)
        usage.ttft_s = first[0] / 1e6 if first else None
        usage.pieces.extend(d / 1e6 for d in raw.m_durations)
        if tokens and tokens[-1] in self.model.eos:
            tokens, self.eos = tokens[:-1], True
        self.q.put(tokens)  # the whole list, once

    def token(self, token: int) -> bool:
        """The streamer's, on the generation thread: one token came; False stops the generation (EOS, a stop
        string, a client gone)."""
        if self.cancel.is_set():
            return False
        now, usage = time.perf_counter(), self.usage
        if usage.ttft_s is None:
            usage.ttft_s = now - self.t0
        else:
            usage.pieces.append(now - self.last)
        self.last = now
        if token in self.model.eos:
            self.eos = True
            return False
        self.q.put(token)
        return True

    def _next(self) -> Any:
        """The next item of the queue: a token id, _DONE, an exception, or None after KEEPALIVE_S of nothing."""
        try:
            return self.q.get(timeout=KEEPALIVE_S)
        except queue.Empty:
            return None

    def _more(self, first: int) -> tuple[list[int], Any]:
        """`first` and the token ids queued behind it; the item that ended them (_DONE, an exception) or None."""
        ids = [first]
        while True:
            try:
                item = self.q.get_nowait()
            except queue.Empty:
                return ids, None
            if not isinstance(item, int):
                return ids, item
            ids.append(item)

    def pieces(self) -> Generator[str, None, None]:
        self.thread.start()
        usage, held, pace = self.usage, None, self.pace
        while True:
            item, held = (held, None) if held is not None else (self._next(), None)
            if item is None:
                yield ""  # waiting for the pipeline or a token: the stream still checks its client
                continue
            if item is _DONE:
                break
            if isinstance(item, BaseException):
                raise item
            if isinstance(item, list):  # a generation read whole: its tokens at once (_generate_whole)
                self.text.ids.extend(item)
                usage.completion_tokens += len(item)
                continue
            wait = pace.left()
            if wait > 0:  # the generation goes on: what it makes meanwhile goes out in this piece
                self.finished.wait(wait)
            ids, held = self._more(item)
            out, stopped = self._read(ids)
            yield pace.take(out)  # "" when the tokens end no character yet
            if stopped:
                self.cancel.set()
                usage.finish_reason = "stop"
                yield pace.rest()
                return
        out, stopped = self.scan.feed(self.text.rest())  # it ran out (max_tokens, max_length) or reached EOS
        usage.finish_reason = "stop" if stopped or self.eos else "length"
        out = pace.rest() + out + ("" if stopped else self.scan.rest())
        if out:
            yield out

    def _read(self, ids: list[int]) -> tuple[str, bool]:
        """The text of `ids` with stop strings cut, whether one was reached; the tokens read counted (with a stop
        string, token by token up to the one that reached it)."""
        if not self.scan.stop:
            self.usage.completion_tokens += len(ids)
            return self.scan.feed(self.text.add(ids))
        out = ""
        for token in ids:
            self.usage.completion_tokens += 1
            piece, stopped = self.scan.feed(self.text.add([token]))
            out += piece
            if stopped:
                return out, True
        return out, False

    def close(self) -> None:
        self.cancel.set()
        if self.thread.is_alive():
            self.thread.join()
        keep = self.usage.completion_tokens - (0 if self.eos else 1)  # a stamp a later token, EOS's included
        del self.usage.pieces[max(0, keep) :]  # none for tokens made after a stop string or a hang-up


class OVGenaiModel(GenerativeModel):
    runtime = OV_GENAI
    shared_pool = True  # its pipelines in one process share OpenVINO's CPU thread pool

    def __init__(
        self, name: str, model_dir: Path, provider: str, budget: KVBudget, version: str, spec: EngineSpec
    ) -> None:
        try:
            import openvino as ov
            import openvino_genai as ovg
        except ImportError as exc:
            raise ModelUnavailable(
                f"{name}: openvino-genai is not installed (pip install 'edge-agent[openvino-genai]')"
            ) from exc
        from agent.generative.ovrow import HINTS

        super().__init__(name, model_dir, provider, budget, version)
        self.ov, self.ovg = ov, ovg
        self.device = provider.upper()  # OpenVINO's device names: CPU, GPU, GPU.1, NPU
        self.spec, self.hints = spec, HINTS["default" if spec.precision == DEVICE_DEFAULT else "fp32"]
        one = {"INFERENCE_NUM_THREADS": 1} if spec.pair_copy else {}  # a pairs' copy runs on the calling thread
        pipe = ovg.LLMPipeline(str(model_dir), self.device, **self.hints, **one)
        self.pipelines = Pipelines(pipe)
        self.tokenizer = pipe.get_tokenizer()
        self.eos = {int(pipe.get_generation_config().eos_token_id), int(self.tokenizer.get_eos_token_id())}
        self.kv = ov_kv_shape(model_dir, spec.max_length or _package_max_length(model_dir))
        self._compiled: Any = None  # the IR compiled by openvino.Core for teacher-forced logits (the shadow's)
        self._compile_lock = threading.Lock()
        self._streamer: Any = None  # the StreamerBase subclass each generation's streamer is made of

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text).input_ids.data[0]]

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def ids(self, seq: list[int]) -> Any:
        return self.ov.Tensor(np.asarray([seq], dtype=np.int64))

    def streamer(self, run: _Run) -> Any:
        if self._streamer is None:  # one class a model (a class made a request cost its TTFT about 0.1 ms)
            ovg = self.ovg
            stop, running = ovg.StreamingStatus.STOP, ovg.StreamingStatus.RUNNING

            class Streamer(ovg.StreamerBase):  # type: ignore[name-defined]
                def __init__(self, run: _Run) -> None:
                    super().__init__()
                    self.run = run

                def write(self, token: Any) -> Any:
                    for t in token if isinstance(token, list) else [token]:
                        if not self.run.token(int(t)):
                            return stop
                    return running

                def end(self) -> None:
                    return None

            self._streamer = Streamer
        return self._streamer(run)

    def generate(
        self, prompt: list[int], sampling: Sampling, usage: Usage, lease: Lease, streamed: bool = True
    ) -> Generator[str, None, None]:
        usage.prompt_tokens = len(prompt)
        self.recent.add(prompt)
        run = _Run(self, prompt, sampling, usage, streamed)
        try:
            yield from run.pieces()
        finally:
            run.close()  # the generation has returned: its KV cache is no longer in use
            self.ended(prompt, sampling, usage, lease)

    def _greedy(self, pipe: Any, prompt: list[int], tokens: int) -> list[int]:
        res = pipe.generate(
            self.ids(prompt), max_new_tokens=tokens, min_new_tokens=tokens, do_sample=False, ignore_eos=True
        )
        return [int(t) for t in res.tokens[0]]

    def continuation(self, prompt: list[int], tokens: int) -> list[int]:
        with self.pipelines.borrow() as pipe:
            return list(prompt) + self._greedy(pipe, prompt, tokens)

    def teacher_logits(self, seq: list[int]) -> np.ndarray:
        """Qualification's own read (agent.generative.ovrow: LLMPipeline returns no logits): the IR compiled by
        openvino.Core on the same device with the same hints, one stateful infer over `seq`."""
        from agent.generative.ovrow import _teacher_forced

        with self._compile_lock:
            if self._compiled is None:
                xml = str(self.model_dir / "openvino_model.xml")
                self._compiled = self.ov.Core().compile_model(xml, self.device, self.hints)
        return _teacher_forced(self.ov, self._compiled, seq)

    def paired_tpot(self, prompt: list[int], warm: int, tokens: int, cpu: bool) -> float | None:
        """LLMPipeline.generate has no step of its own: (cost of 1 + warm + tokens greedy tokens - cost of
        1 + warm) / tokens, both on the calling thread (no streamer), back to back on the same pipeline. A pairs'
        copy (spec.pair_copy: one inference thread, which is the calling one) is timed by that thread's own clock:
        the process's OpenVINO pipelines share one CPU thread pool, whose clocks the live generations move too."""
        with self.pipelines.borrow() as pipe:
            short = self._timed(pipe, prompt, 1 + warm, cpu)
            whole = self._timed(pipe, prompt, 1 + warm + tokens, cpu)
        if short is None or whole is None or whole <= short:
            return None
        return (whole - short) / tokens

    def _timed(self, pipe: Any, prompt: list[int], tokens: int, cpu: bool) -> float | None:
        from agent.serving.rungate import CpuMark

        own = cpu and self.spec.pair_copy
        mark = CpuMark(self) if cpu and not own else None
        t0, c0 = time.perf_counter(), time.thread_time()
        self._greedy(pipe, prompt, tokens)
        if own:  # a thread's clock stops while it waits for a core: never contended
            return time.thread_time() - c0
        spent = mark.spent() if mark is not None else time.perf_counter() - t0
        return None if mark is not None and mark.contended else spent


def _package_max_length(model_dir: Path) -> int:
    """model.yaml's max_length: the package's root or (a variant's directory) the one above it."""
    from agent.generative.package import load_generative

    root = model_dir if (model_dir / "model.yaml").is_file() else model_dir.parent
    return load_generative(root).max_length
