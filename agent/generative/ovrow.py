"""One qualification row through OpenVINO GenAI (`LLMPipeline`), run in the row's own process by
agent.generative.rowproc when the spec's runtime is openvino-genai. The spec is rowproc's, with `provider` an
OpenVINO device (CPU, GPU, NPU) and `precision` the hints it is compiled with (fp32: INFERENCE_PRECISION_HINT and
KV_CACHE_PRECISION f32, the reference's; default: the device's own, e.g. bf16 and a u8 KV cache on a CPU with
AVX512-BF16).

LLMPipeline returns tokens and a sequence score, not logits: the teacher-forced logits (the fidelity gate) are read
from the same IR compiled by openvino.Core on the same device with the same hints (one stateful infer over the held
sequence), and the greedy tokens (reported) come from LLMPipeline itself. Timings are LLMPipeline.generate's, from
a StreamerBase that stamps each token as the pipeline hands it over.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np

from agent.generative.rowstats import measured_row, pct, prompt_of

HINTS: dict[str, dict[str, str]] = {
    "fp32": {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"},
    "default": {},
}
MEASURE = (
    "teacher-forced logits through openvino.Core on the row's IR, device and hints (LLMPipeline returns no "
    "logits); greedy tokens and pipeline_top1 (its one greedy token after each prefix) through LLMPipeline.generate"
)
HOW_MEASURED = {
    "load_s": "LLMPipeline(models_path, device, **hints): read and compile, in the row's own process",
    "ttft_ms": "LLMPipeline.generate(input_ids) to the first token its streamer receives, per prompt length, "
    "after a warm-up",
    "tpot_ms": "the time between the later tokens the streamer receives in greedy generations of tpot_tokens "
    "(ignore_eos), all repeats pooled",
    "peak_rss_bytes": "the row process's VmHWM after a greedy generation to max_length (ignore_eos: KV cache at "
    "its largest); includes the runtime, the timing runs and the openvino.Core compile of the fidelity reads",
    "fidelity": MEASURE + "; teacher-forced on each judge prompt + the reference's greedy continuation (gated); "
    "greedy match over the first greedy_tokens and the first divergence (reported)",
}


def _ids(ov: Any, seq: list[int]) -> Any:
    return ov.Tensor(np.asarray([seq], dtype=np.int64))


def _timed(ov: Any, ovg: Any, pipe: Any, prompt: list[int], new_tokens: int) -> tuple[float, list[float]]:
    """(seconds to the first token, seconds per later token) of one greedy LLMPipeline.generate."""

    class Clock(ovg.StreamerBase):
        def __init__(self) -> None:
            super().__init__()
            self.times: list[float] = []

        def write(self, token: Any) -> Any:
            self.times.append(time.perf_counter())
            return ovg.StreamingStatus.RUNNING

        def end(self) -> None:
            return None

    clock = Clock()
    t0 = time.perf_counter()
    pipe.generate(_ids(ov, prompt), max_new_tokens=new_tokens, do_sample=False, ignore_eos=True, streamer=clock)
    stamps = [t0, *clock.times]
    steps = [b - a for a, b in zip(stamps[1:], stamps[2:], strict=False)]
    return (clock.times[0] - t0) if clock.times else float("nan"), steps


def _greedy(ov: Any, pipe: Any, prompt: list[int], count: int, *, ignore_eos: bool = False) -> list[int]:
    res = pipe.generate(_ids(ov, prompt), max_new_tokens=count, do_sample=False, ignore_eos=ignore_eos)
    return [int(t) for t in res.tokens[0]]


def _teacher_forced(ov: Any, compiled: Any, seq: list[int]) -> np.ndarray:
    req = compiled.create_infer_request()
    req.reset_state()
    n = len(seq)
    out = req.infer(
        {
            "input_ids": np.asarray([seq], np.int64),
            "attention_mask": np.ones((1, n), np.int64),
            "position_ids": np.arange(n, dtype=np.int64)[None],
            "beam_idx": np.zeros(1, np.int32),
        }
    )
    logits: np.ndarray = np.asarray(out["logits"], dtype=np.float32)[0]
    return logits


def _next_tokens(ov: Any, pipe: Any, seq: list[int], prompt_len: int) -> list[int]:
    """LLMPipeline's own teacher-forced top-1: its one greedy token after each prefix seq[:j+1], for the positions j
    that predict the continuation (prompt_len-1 .. len(seq)-2), one generate call each."""
    return [_greedy(ov, pipe, seq[: j + 1], 1, ignore_eos=True)[0] for j in range(prompt_len - 1, len(seq) - 1)]


def _timings(ov: Any, ovg: Any, pipe: Any, spec: dict[str, Any], seed: list[int]) -> tuple[dict[str, Any], Any]:
    ttft: dict[str, Any] = {}
    tpot: list[float] = []
    for n in spec["prompt_lengths"]:
        prompt = prompt_of(seed, int(n))
        _timed(ov, ovg, pipe, prompt, 2)  # warm-up at this length
        firsts = []
        for _ in range(int(spec["repeats"])):
            first, steps = _timed(ov, ovg, pipe, prompt, int(spec["tpot_tokens"]))
            firsts.append(first)
            tpot.extend(steps)
        ttft[str(n)] = pct(firsts)
    return ttft, pct(tpot)


def _compiled_with(compiled: Any) -> dict[str, str]:
    """The precisions the device compiled the IR with (what `default` hints turned into on this host)."""
    found = {}
    for key in HINTS["fp32"]:
        try:
            value = compiled.get_property(key)
            found[key] = value.to_string() if hasattr(value, "to_string") else str(value)
        except Exception:  # noqa: BLE001, S112 - a device that does not report a property: leave it out
            continue
    return found


def measure(spec: dict[str, Any]) -> dict[str, Any]:
    import openvino as ov
    import openvino_genai as ovg

    device, model_dir = str(spec["provider"]), str(spec["model_dir"])
    hints = HINTS[str(spec.get("hints") or "fp32")]
    core = ov.Core()
    if device not in core.available_devices:
        return {
            "status": "unavailable",
            "reason": f"OpenVINO sees no {device} device here (available: {', '.join(core.available_devices)})",
        }
    t0 = time.perf_counter()
    try:
        pipe = ovg.LLMPipeline(model_dir, device, **hints)
    except Exception as exc:  # noqa: BLE001 - the runtime's own words name why this device cannot load it
        return {"status": "unavailable", "reason": f"{type(exc).__name__}: {exc}".strip()}
    load_s = time.perf_counter() - t0
    tok = pipe.get_tokenizer()
    prompts = [[int(t) for t in tok.encode(text).input_ids.data[0]] for text in spec["prompt_texts"]]
    seed = [t for p in prompts for t in p] or [0]
    ttft, tpot = _timings(ov, ovg, pipe, spec, seed)
    greedy = [_greedy(ov, pipe, p, int(spec["greedy_tokens"])) for p in prompts]
    held = spec.get("held") or [p + g for p, g in zip(prompts, greedy, strict=True)]
    compiled = core.compile_model(str(Path(model_dir) / "openvino_model.xml"), device, hints)
    out_dir = Path(spec["out_dir"])
    for k, seq in enumerate(held):
        np.save(out_dir / f"held_{k}.npy", _teacher_forced(ov, compiled, seq))
    pipeline_next = [_next_tokens(ov, pipe, seq, len(p)) for seq, p in zip(held, prompts, strict=True)]
    max_length = int(spec["max_length"])
    full = _greedy(ov, pipe, seed[:1], max_length - 1, ignore_eos=True)  # the KV cache at max_length
    return {
        **measured_row(load_s, ttft, tpot, prompts, greedy, held, 1 + len(full)),
        "compiled_with": _compiled_with(compiled),
        "fidelity_measure": MEASURE,
        "pipeline_next": pipeline_next,
        "versions": {"openvino-genai": str(ovg.__version__), "openvino": str(ov.__version__)},
    }
