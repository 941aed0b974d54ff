"""Fidelity of a generative row against the fp32 CPU reference.

The gate: teacher-forced top-1 agreement (on each held sequence, the judge prompt plus the reference's greedy
continuation, the positions that predict the continuation: does the row's arg-max equal the reference's?) and the
max |logit difference| over those positions. Reported, not gated: greedy token match over the first N tokens of
each prompt and the index of the first divergence (one early flip changes everything after it).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np


def teacher_forced(ref_dir: Path, row_dir: Path, prompt_lengths: list[int]) -> dict[str, Any]:
    return agreement(
        (np.load(ref_dir / f"held_{k}.npy"), np.load(row_dir / f"held_{k}.npy"), plen)
        for k, plen in enumerate(prompt_lengths)
    )


def agreement(sequences: Iterable[tuple[np.ndarray, np.ndarray, int]]) -> dict[str, Any]:
    """Top-1 agreement and max |logit diff| over (reference logits, row logits, prompt length) of teacher-forced
    sequences ([positions, vocab] each): the positions that predict the continuation. Also the live-prompt shadow's
    measure (agent.trial.genshadow: the serving version is the reference there)."""
    agree = total = 0
    max_diff = 0.0
    for k, (ref, got, plen) in enumerate(sequences):
        if ref.shape != got.shape:
            return {
                "top1": 0.0,
                "max_logit_diff": None,
                "positions": 0,
                "reason": f"held sequence {k}: logits {got.shape} against the reference's {ref.shape}",
            }
        span = slice(max(0, plen - 1), ref.shape[0] - 1)  # the positions that predict the continuation
        r, g = ref[span], got[span]
        agree += int((r.argmax(-1) == g.argmax(-1)).sum())
        total += r.shape[0]
        if r.size:
            max_diff = max(max_diff, float(np.abs(r.astype(np.float64) - g.astype(np.float64)).max()))
    return {"top1": agree / total if total else None, "max_logit_diff": max_diff, "positions": total}


def next_token_agreement(ref_dir: Path, prompt_lengths: list[int], predicted: list[list[int]]) -> float | None:
    """The share of a runtime's own next-token predictions after each prefix of the held sequences (positions
    prompt_len-1 .. end-1) that equal the reference's teacher-forced arg-max at those positions."""
    agree = total = 0
    for k, (plen, got) in enumerate(zip(prompt_lengths, predicted, strict=True)):
        ref = np.load(ref_dir / f"held_{k}.npy")[max(0, plen - 1) : -1].argmax(-1)
        n = min(len(ref), len(got))
        agree += int((ref[:n] == np.asarray(got[:n])).sum())
        total += max(len(ref), len(got))
    return agree / total if total else None


def greedy(ref: list[list[int]], got: list[list[int]], first: int) -> dict[str, Any]:
    """Token match over the first `first` greedy tokens of each prompt, and the earliest divergence index."""
    match = total = 0
    diverged: int | None = None
    for r, g in zip(ref, got, strict=True):
        r, g = r[:first], g[:first]
        n = max(len(r), len(g))
        same = [i < len(r) and i < len(g) and r[i] == g[i] for i in range(n)]
        match += sum(same)
        total += n
        if not all(same):
            idx = same.index(False)
            diverged = idx if diverged is None else min(diverged, idx)
    return {"match": match / total if total else None, "tokens": total, "first_divergence": diverged}


def gate(row: dict[str, Any], gates: dict[str, Any]) -> list[str]:
    """Why a measured row fails its gates (empty: it passes)."""
    why = fidelity_gate(row.get("fidelity") or {}, gates)
    tpot = (row.get("tpot_ms") or {}).get("p50_ms")
    if gates.get("max_tpot_ms") is not None and (tpot is None or tpot > gates["max_tpot_ms"]):
        why.append(f"TPOT p50 {_f(tpot)} ms over the budget {gates['max_tpot_ms']} ms")
    rss = row.get("peak_rss_bytes")
    if gates.get("max_rss_mb") is not None and (rss is None or rss / 2**20 > gates["max_rss_mb"]):
        why.append(f"peak RSS {_f(rss / 2**20 if rss else None)} MiB over the budget {gates['max_rss_mb']} MiB")
    return why


def fidelity_gate(fid: dict[str, Any], gates: dict[str, Any]) -> list[str]:
    """Why teacher-forced figures ({"top1", "max_logit_diff"}) fall under the fidelity floor (empty: they pass)."""
    why = []
    top1, diff = fid.get("top1"), fid.get("max_logit_diff")
    if top1 is None or top1 < gates["min_top1"]:
        why.append(f"teacher-forced top-1 agreement {_f(top1)} under the floor {gates['min_top1']}")
    if diff is None or diff > gates["max_logit_diff"]:
        why.append(f"max |logit diff| {_f(diff)} over {gates['max_logit_diff']}")
    own = fid.get("pipeline_top1")  # openvino-genai: LLMPipeline's own next token after each prefix
    if own is not None and own < gates["min_top1"]:
        why.append(f"LLMPipeline's next-token agreement {_f(own)} under the floor {gates['min_top1']}")
    return why


def _f(v: float | None) -> str:
    return "not measured" if v is None else f"{v:.4g}"
