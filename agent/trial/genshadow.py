"""Shadow fidelity of a generative version on live prompts, before the swap (docs/generative.md, "Shadow"): the
candidate is loaded beside the serving version and no client sees its text. On each recent live prompt (copies the
serving model keeps: agent.serving.generative.recent) the serving version's own greedy continuation of
`TEACHER_TOKENS` tokens is the teacher sequence; both versions read their logits teacher-forced on it, and the
qualification's own measure (agent.generative.fidelity.agreement: top-1 agreement and max |logit diff| over the
positions that predict the continuation) against the serving version is gated on the target's fidelity floor (the
gates qualification uses). Under it: the swap is refused. No live prompt judged: "not judged", the deployment goes
on (probation and serving.unjudged decide)."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np

from agent.generative.fidelity import agreement, fidelity_gate
from agent.serving.errors import ServerBusy
from agent.trial.unjudged import NOT_JUDGED

PASS, FAIL = "pass", "fail"
TEACHER_TOKENS = 32  # the serving version's greedy continuation of each live prompt (EOS suppressed)


def _teacher(model: Any, prompt: list[int], tokens: int) -> list[int]:
    """`prompt` and `model`'s greedy continuation of `tokens` tokens."""
    out: list[int] = model.continuation(prompt, tokens)
    return out


def _logits(model: Any, seq: list[int]) -> np.ndarray:
    logits: np.ndarray = model.teacher_logits(seq)
    return logits


def _leased(model: Any, seq: list[int], run: Callable[[Any, list[int]], Any]) -> Any:
    """run(model, seq) holding its KV cache in the serving budget (ServerBusy when the client streams leave none)."""
    lease = model.budget.lease(model.kv.bytes_for(len(seq) + 1), "a shadow run on a live prompt")
    try:
        return run(model, seq)
    finally:
        lease.release()


def judge(
    incumbent: Any,
    candidate: Any,
    gates: dict[str, Any],
    check: Callable[[], None] = lambda: None,
    tokens: int = TEACHER_TOKENS,
) -> dict[str, Any]:
    """The shadow block: `candidate` (loaded, not serving) against `incumbent` (serving) on the incumbent's recent
    live prompts; verdict pass, fail or not judged, with the figures. check() raises to cancel."""
    t0 = time.perf_counter()
    prompts = incumbent.recent.recent()
    room = max(1, min(incumbent.kv.max_length, candidate.kv.max_length) - tokens)
    sequences, busy = [], 0
    for prompt in prompts:
        check()
        prompt = prompt[-room:]
        try:
            seq = _leased(incumbent, prompt + [0] * tokens, lambda m, s: _teacher(m, s[: len(s) - tokens], tokens))
            ref = _leased(incumbent, seq, _logits)
            got = _leased(candidate, seq, _logits)
        except ServerBusy:
            busy += 1  # the client streams hold the KV budget: this prompt is not judged, none waits for it
            continue
        sequences.append((ref, got, len(prompt)))
    floor = {k: gates[k] for k in ("min_top1", "max_logit_diff")}
    fid = agreement(sequences)
    doc: dict[str, Any] = {
        "measure": "teacher-forced on live prompts",
        "against": incumbent.version,
        "requests": len(sequences),  # live prompts judged
        "offered": len(prompts),
        "busy": busy,
        "teacher_tokens": tokens,
        "positions": fid["positions"],
        "agreement": fid["top1"],
        "max_logit_diff": fid["max_logit_diff"],
        "floor": floor,
        "elapsed_s": round(time.perf_counter() - t0, 3),
    }
    if not sequences:
        none = "no live prompts" if not prompts else f"all {busy} live prompts found the KV budget held by clients"
        doc.update(agreement=None, max_logit_diff=None)
        return {**doc, "verdict": NOT_JUDGED, "reason": f"shadow: not judged: {none}"}
    why = [fid["reason"]] if fid.get("reason") else fidelity_gate(fid, floor)
    where = f"on {len(sequences)} live prompts against version {incumbent.version}"
    if why:
        return {**doc, "verdict": FAIL, "reason": f"shadow: {'; '.join(why)} ({where})"}
    return {
        **doc,
        "verdict": PASS,
        "reason": f"shadow passed: teacher-forced top-1 agreement {fid['top1']:.4g} {where}",
    }
