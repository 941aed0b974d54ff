"""A generative model served by the agent against the same model run directly by its runtime (issue 39; not run by
the tests): onnxruntime-genai (og.Generator), or with --runtime openvino-genai LLMPipeline.generate (f32 hints, as
the package's fp32 row is served).

  (1) TTFT: a request for 1 token (served: the whole non-streamed answer over HTTP; direct: append_tokens + the
      first generate_next_token) and
  (2) time per further token: a greedy request for --tokens tokens (EOS suppressed neither side), served through
      POST /v1/completions, direct through og.Generator: (median T(tokens) - median T(1)) / (tokens generated - 1),
      the request's fixed cost (HTTP, prefill) left out; served twice: the whole answer, and streamed
      (`"stream": true`, SSE events read until [DONE]); direct twice: run whole, and with the runtime's own
      streaming of text (onnxruntime-genai: a TokenizerStream's decode a token; OpenVINO GenAI: a Python
      callable streamer, each token's text decoded by its TextStreamer). Streamed is shown against both,
      ("... streamed": against the runtime run whole; "... vs streamed": against its own streaming),
each from --rounds rounds, served and direct alternating (ABBA) in the same run; the served/direct ratio (the
agent's overhead per token; issue 39's goal: under 1.05x), tokens/s, and the load average while it ran.

The server is the daemon's path (agent.yaml -> start_fronts -> serving.generative) in a child process; the client
and the direct runs share this process. The model: --package DIR (a generative package: a real small model when
one is at hand), else one made in code with --layers/--hidden (the 2x32 default is ~30 us a token: HTTP dominates).

Usage: .venv/bin/python bench/bench_generative.py [--runtime onnxruntime-genai|openvino-genai] [--package DIR]
       [--layers 4 --hidden 512] [--tokens 64] [--prompt-tokens 32] [--rounds 7] [--json]
"""

from __future__ import annotations

import argparse
import http.client
import json
import multiprocessing as mp
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))


def _serve(pkg: str, port_q: mp.Queue, stop: mp.Event) -> None:
    from agent.config.load import parse_config
    from agent.serving.fronts import start_fronts
    from agent.serving.registry import ModelRegistry

    cfg = parse_config(
        {
            "serving": {
                "port": 0,
                "grpc_port": None,
                "generative": {"kv_budget": "1G", "models": {"lm": {"package": pkg}}},
            }
        }
    )
    srv, _ = start_fronts(ModelRegistry(), cfg.serving)
    port_q.put(srv.port)
    stop.wait()
    srv.shutdown(5)


def _served(port: int, prompt: str, tokens: int) -> tuple[float, int]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": "lm", "prompt": prompt, "max_tokens": tokens, "temperature": 0})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    doc = json.loads(conn.getresponse().read())
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed, int(doc["usage"]["completion_tokens"])


def _streamed(port: int, prompt: str, tokens: int) -> tuple[float, int]:
    """The same request streamed (`"stream": true`): until `data: [DONE]`; the count of text events."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=600)
    body = json.dumps({"model": "lm", "prompt": prompt, "max_tokens": tokens, "temperature": 0, "stream": True})
    t0 = time.perf_counter()
    conn.request("POST", "/v1/completions", body, {"Content-Type": "application/json"})
    resp, events = conn.getresponse(), 0
    for line in resp:
        if line.startswith(b"data: [DONE]"):
            break
        events += line.startswith(b"data: ")
    elapsed = time.perf_counter() - t0
    conn.close()
    return elapsed, events


def _direct(og, model, ids: list[int], tokens: int, stream=None) -> tuple[float, int]:
    t0 = time.perf_counter()
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=len(ids) + tokens, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    n = 0
    while not gen.is_done() and n < tokens:
        gen.generate_next_token()
        token = gen.get_next_tokens()[0]
        if stream is not None:  # the runtime's own streaming idiom: a TokenizerStream's text a token
            stream.decode(token)
        n += 1
    return time.perf_counter() - t0, n


class OVDirect:
    """The same model run directly by OpenVINO GenAI: LLMPipeline.generate(input_ids), greedy, no streamer."""

    def __init__(self, pkg: str) -> None:
        import openvino as ov
        import openvino_genai as ovg

        self.ov, self.ovg = ov, ovg
        self.pipe = ovg.LLMPipeline(pkg, "CPU", INFERENCE_PRECISION_HINT="f32", KV_CACHE_PRECISION="f32")
        self.eos = self.pipe.get_generation_config().eos_token_id

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.pipe.get_tokenizer().encode(text).input_ids.data[0]]

    def decode(self, ids: list[int]) -> str:
        return str(self.pipe.get_tokenizer().decode(ids))

    def run(self, ids: list[int], tokens: int, streamed: bool = False) -> tuple[float, int]:
        """Streamed: LLMPipeline's own text streaming (a Python callable gets each token's text, decoded by the
        pipeline's TextStreamer), the runtime's API for what a streamed request serves."""
        import numpy as np

        running = self.ovg.StreamingStatus.RUNNING
        extra = {"streamer": lambda _text: running} if streamed else {}
        t0 = time.perf_counter()
        res = self.pipe.generate(
            self.ov.Tensor(np.asarray([ids], np.int64)), max_new_tokens=tokens, do_sample=False, **extra
        )
        elapsed = time.perf_counter() - t0
        out = [int(t) for t in res.tokens[0]]
        return elapsed, len(out[: out.index(self.eos)] if self.eos in out else out)


class OrtDirect:
    """The same model run directly by onnxruntime-genai: og.Generator, append_tokens, generate_next_token."""

    def __init__(self, pkg: str) -> None:
        import onnxruntime_genai as og

        self.og, self.model = og, og.Model(pkg)
        self.tokenizer = og.Tokenizer(self.model)

    def encode(self, text: str) -> list[int]:
        return [int(t) for t in self.tokenizer.encode(text)]

    def decode(self, ids: list[int]) -> str:
        return str(self.tokenizer.decode(ids))

    def run(self, ids: list[int], tokens: int, streamed: bool = False) -> tuple[float, int]:
        return _direct(self.og, self.model, ids, tokens, self.tokenizer.create_stream() if streamed else None)


def _pair(direct, port, prompt, ids, tokens, rounds) -> dict:
    """Medians of the whole request for 1 token (TTFT) and for `tokens` tokens, served and direct alternating (ABBA:
    drifts in load hit both sides alike); per token: (T(tokens) - T(1)) / (tokens - 1), so the request's fixed cost
    (HTTP, prefill) is not spread over the tokens and only what each further token costs is compared."""
    times: dict[tuple[str, int], list[float]] = {}
    count: dict[str, int] = {}
    run = {
        "s": lambda n: _served(port, prompt, n),
        "t": lambda n: _streamed(port, prompt, n),
        "d": lambda n: direct.run(ids, n),
        "u": lambda n: direct.run(ids, n, streamed=True),
    }
    for r in range(rounds):
        order = ("s", "t", "d", "u") if r % 2 == 0 else ("u", "d", "t", "s")
        for n in (1, tokens):
            for side in order:
                t, got = run[side](n)
                times.setdefault((side, n), []).append(t)
                if n == tokens:
                    count[side] = got
    count["t"] = count["s"]  # the same greedy tokens (a streamed event may carry more than one)
    med = {k: statistics.median(v) for k, v in times.items()}
    out = {"ttft": {"served_ms": med["s", 1] * 1000, "direct_ms": med["d", 1] * 1000}}
    per = {side: (med[side, tokens] - med[side, 1]) / max(1, count[side] - 1) for side in run}
    out["per_token"] = {"served_ms": per["s"] * 1000, "direct_ms": per["d"] * 1000, "tokens": count}
    # a streamed request against the runtime run whole (the strict one) and against the runtime's own streaming
    out["per_token_streamed"] = {"served_ms": per["t"] * 1000, "direct_ms": per["d"] * 1000}
    out["per_token_streamed_vs_streamed"] = {"served_ms": per["t"] * 1000, "direct_ms": per["u"] * 1000}
    for v in out.values():
        v["ratio"] = v["served_ms"] / v["direct_ms"]
    return out


def _made(where: Path, a: argparse.Namespace) -> str:
    """A package of the decoder made in code, --layers x --hidden, in --runtime's layout."""
    heads = max(1, a.hidden // 64) if a.hidden >= 64 else 2
    if a.runtime == "openvino-genai":
        from agent.generative.samples import write_openvino_package

        shape = {"layers": a.layers, "hidden": a.hidden, "heads": heads}
        return str(write_openvino_package(where, variants=(), max_length=512, **shape))
    from agent.generative.samples import write_generative_package
    from agent.generative.tinymodel import write_tiny_genai

    pkg = write_generative_package(where, variants=(), max_length=512)
    write_tiny_genai(pkg, layers=a.layers, hidden=a.hidden, heads=heads, max_length=512)
    return str(pkg)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--runtime", choices=("onnxruntime-genai", "openvino-genai"), default="onnxruntime-genai")
    ap.add_argument("--package")
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--hidden", type=int, default=32)
    ap.add_argument("--tokens", type=int, default=64)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--rounds", type=int, default=7)
    ap.add_argument("--json", action="store_true")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        pkg = a.package or _made(Path(tmp) / "lm", a)
        direct = OVDirect(pkg) if a.runtime == "openvino-genai" else OrtDirect(pkg)
        ids = (direct.encode("The quick brown fox jumps over the lazy dog. ") * 64)[: a.prompt_tokens]
        prompt = direct.decode(ids)
        ctx = mp.get_context("spawn")
        q, stop = ctx.Queue(), ctx.Event()
        child = ctx.Process(target=_serve, args=(pkg, q, stop))
        child.start()
        try:
            port = q.get(timeout=120)
            _served(port, prompt, 4), direct.run(ids, 4)  # warm-up both
            load = os.getloadavg()
            out = {
                "runtime": a.runtime,
                "model": pkg if a.package else f"made in code: {a.layers} layers x {a.hidden}",
                "prompt_tokens": len(ids),
                "tokens": a.tokens,
                "rounds": a.rounds,
                **_pair(direct, port, prompt, ids, a.tokens, a.rounds),
                "load_average": {"before": load, "after": os.getloadavg(), "cpus": os.cpu_count()},
            }
        finally:
            stop.set()
            child.join(30)
    if a.json:
        print(json.dumps(out, indent=2))
    else:
        print(
            f"{out['runtime']}: model {out['model']}, prompt {out['prompt_tokens']} tokens, {a.tokens} greedy tokens, "
            f"medians of {a.rounds} rounds (ABBA)"
        )
        for key, label in (
            ("ttft", "TTFT (1 token)"),
            ("per_token", "per further token"),
            ("per_token_streamed", "  ... streamed"),
            ("per_token_streamed_vs_streamed", "  ... vs streamed"),
        ):
            r = out[key]
            print(
                f"  {label:16s} served {r['served_ms']:.3f} ms  direct {r['direct_ms']:.3f} ms  "
                f"ratio {r['ratio']:.2f}x (goal < 1.05x), {1000 * (r['served_ms'] - r['direct_ms']):+.0f} us"
            )
        print(
            f"  tokens/s         served {1000 / out['per_token']['served_ms']:.0f}  "
            f"direct {1000 / out['per_token']['direct_ms']:.0f}"
        )
        la = out["load_average"]
        print(
            f"  load average {' '.join(f'{x:.2f}' for x in la['before'])} before, "
            f"{' '.join(f'{x:.2f}' for x in la['after'])} after ({la['cpus']} CPUs)"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
