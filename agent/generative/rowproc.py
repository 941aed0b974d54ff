"""One qualification row of a generative model, run in its own process (`python -m agent.generative.rowproc
SPEC.json`), so its peak RSS is its own and a crash or hang costs only the row. Prints one JSON line.

SPEC: {"model_dir", "provider", "max_length", "prompt_lengths": [n, ...], "tpot_tokens", "repeats",
       "prompt_texts": [judge prompts], "held": [[ids], ...] or null (the teacher-forced sequences; null: this is
       the reference, which holds each prompt plus its own greedy continuation), "greedy_tokens", "out_dir",
       "runtime" (openvino-genai: measured by agent.generative.ovrow instead, "hints" its precision hints)}.
Measures, through onnxruntime-genai itself: load time; time to first token per prompt length (prefill + the first
generate step), time per output token over `tpot_tokens` greedy tokens; teacher-forced logits on each held sequence
(saved as out_dir/held_K.npy); greedy tokens from each judge prompt; then one generation up to max_length so the KV cache
is at its largest, and the process's peak RSS (VmHWM) after it.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.generative.rowstats import measured_row, pct, prompt_of


def _model(og: Any, model_dir: str, provider: str) -> Any:
    cfg = og.Config(model_dir)
    cfg.clear_providers()
    if provider != "cpu":
        cfg.append_provider(provider)
    return og.Model(cfg)


def _generator(og: Any, model: Any, max_length: int, min_length: int = 0) -> Any:
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=max_length, min_length=min_length, do_sample=False)
    return og.Generator(model, params)


def _timed_generation(
    og: Any, model: Any, prompt: list[int], new_tokens: int, max_length: int
) -> tuple[float, list[float]]:
    """(seconds to the first token, seconds per later token) for one greedy generation."""
    gen = _generator(og, model, max_length)
    t0 = time.perf_counter()
    gen.append_tokens(prompt)
    gen.generate_next_token()
    gen.get_next_tokens()
    first = time.perf_counter() - t0
    steps: list[float] = []
    for _ in range(new_tokens - 1):
        if gen.is_done():
            break
        t = time.perf_counter()
        gen.generate_next_token()
        gen.get_next_tokens()
        steps.append(time.perf_counter() - t)
    return first, steps


def _greedy(og: Any, model: Any, prompt: list[int], count: int, max_length: int, min_length: int = 0) -> list[int]:
    gen = _generator(og, model, max_length, min_length)
    gen.append_tokens(prompt)
    out: list[int] = []
    while len(out) < count and not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    return out


def _teacher_forced(og: Any, model: Any, seq: list[int], max_length: int) -> np.ndarray:
    gen = _generator(og, model, max_length)
    gen.append_tokens(seq)
    logits: np.ndarray = np.asarray(gen.get_output("logits"), dtype=np.float32)[0]
    return logits


def _tokenized(og: Any, model: Any, spec: dict[str, Any]) -> tuple[list[list[int]], list[int]]:
    """(the judge prompts as token ids, the seed the timed prompts repeat)."""
    tok = og.Tokenizer(model)
    prompts = [[int(t) for t in tok.encode(text)] for text in spec["prompt_texts"]]
    seed = [t for p in prompts for t in p] or [0]
    return prompts, seed


def _timings(og: Any, model: Any, spec: dict[str, Any], seed: list[int]) -> tuple[dict[str, Any], dict[str, Any]]:
    max_length = int(spec["max_length"])
    ttft: dict[str, Any] = {}
    tpot: list[float] = []
    for n in spec["prompt_lengths"]:
        prompt = prompt_of(seed, int(n))
        _timed_generation(og, model, prompt, 2, max_length)  # warm-up at this length
        firsts = []
        for _ in range(int(spec["repeats"])):
            first, steps = _timed_generation(og, model, prompt, int(spec["tpot_tokens"]), max_length)
            firsts.append(first)
            tpot.extend(steps)
        ttft[str(n)] = pct(firsts)
    return ttft, pct(tpot)


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import onnxruntime_genai as og

    t0 = time.perf_counter()
    try:
        model = _model(og, spec["model_dir"], spec["provider"])
    except Exception as exc:  # noqa: BLE001 - the runtime's own words name why this provider cannot load it
        return {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}".strip()}
    load_s = time.perf_counter() - t0
    max_length = int(spec["max_length"])
    prompts, seed = _tokenized(og, model, spec)
    ttft, tpot = _timings(og, model, spec, seed)
    greedy = [_greedy(og, model, p, int(spec["greedy_tokens"]), max_length) for p in prompts]
    held = spec.get("held") or [p + g for p, g in zip(prompts, greedy, strict=True)]  # the reference's own
    out_dir = Path(spec["out_dir"])
    for k, seq in enumerate(held):
        np.save(out_dir / f"held_{k}.npy", _teacher_forced(og, model, seq, max_length))
    full = _greedy(og, model, seed[:1], max_length, max_length, max_length)  # no early stop: the KV cache at max
    return {
        **measured_row(load_s, ttft, tpot, prompts, greedy, held, 1 + len(full)),
        "versions": {"onnxruntime-genai": str(og.__version__)},
    }


def main(argv: list[str]) -> int:
    spec = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    try:
        if spec.get("runtime") == "openvino-genai":
            from agent.generative.ovrow import measure as measure_ov

            result = measure_ov(spec)
        else:
            result = measure(spec)
    except ImportError as exc:
        result = {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}"}
    except Exception as exc:  # noqa: BLE001 - the row reports the runtime's own words
        result = {"status": "error", "reason": f"{type(exc).__name__}: {exc}".strip()}
    sys.stdout.write(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
