"""Paired TPOT during a generative model's trial (docs/generative.md, "Swap and probation"): the prompt of a
sampled live generation is run again on both versions, back to back on one thread, greedy for the same number of
tokens (EOS suppressed, so both generate exactly as many), and each side's time per output token after the first
(the prefill and the first token are not timed) makes one pair. The ordering (ABBA), the A/A share (incumbent
against incumbent: the noise floor), the CPU share the mirrored generations may take and the verdict are the
paired machinery's own (paired.Pairing, pairjudge.judge): this module only says how a generation is timed.

Time per token is CPU time (rungate.CpuMark: the calling thread and the model's runtime threads) where the model
runs on the host CPU, else wall time; a generation whose runtime threads waited for the cores runs again (as an
ordinary pair's half does). The served side is timed on a twin where serving.probation.paired_twin is on (the
candidate's model loaded again, genprobation.py; trial/twin.py says why). A mirrored generation holds its KV cache
in the serving budget like any request (one that does not fit is not run: the pair is dropped)."""

from __future__ import annotations

import time
from typing import Any

from agent.serving.errors import ServerBusy
from agent.trial.paired import Pairing
from agent.trial.twin import Twin

PAIR_TOKENS = 16  # tokens each side generates per pair, timed ...
WARM_TOKENS = 4  # ... after the prefill's token and these (the version's weights back in the caches)


def tpot(model: Any, prompt: list[int], tokens: int, cpu: bool) -> tuple[float | None, float]:
    """(seconds per output token after the first, None when its threads waited for the cores; seconds the
    whole generation cost). `model`: a serving GenerativeModel; ServerBusy when the KV budget has no room."""
    kv = model.kv
    prompt = prompt[-max(1, kv.max_length - tokens - WARM_TOKENS) :]  # the tail that leaves room for the tokens
    total = len(prompt) + WARM_TOKENS + tokens
    lease = model.budget.lease(kv.bytes_for(total), f"a paired TPOT run of {tokens} tokens")
    try:
        t0, c0 = time.perf_counter(), time.thread_time()
        spent = model.paired_tpot(prompt, WARM_TOKENS, tokens, cpu)  # the runtime's own run (engine.py)
        cost = time.thread_time() - c0 if cpu else time.perf_counter() - t0
        return spent, cost
    finally:
        lease.release()


class TokenPairing(Pairing):
    """Pairs of (incumbent, candidate) TPOT on the prompts of live generations; result() judges them
    (pairjudge.judge with rule.what "TPOT"). Registered as an observer of the candidate GenerativeModel."""

    def __init__(self, incumbent: Any, candidate: Any, *, tokens: int = PAIR_TOKENS, **kw: Any) -> None:
        super().__init__(incumbent, candidate, gate=None, **kw)  # type: ignore[arg-type]  # no run gate: _timed
        self.tokens = int(tokens)
        self.referee_twin: Twin | None = None  # the incumbent's pair copy too (a runtime with a shared pool)
        self.observed: Any = candidate  # the serving model whose generations offer prompts (genprobation.py)

    def _use_twin(self) -> None:
        super()._use_twin()
        if self.referee_twin is not None and not self._stop.is_set():
            session = self.referee_twin.open()
            if session is not None:
                self.incumbent = session

    def stop(self) -> None:
        super().stop()
        if self.referee_twin is not None and (self._thread is None or not self._thread.is_alive()):
            self.referee_twin.close()

    def counts(self) -> dict[str, Any]:
        """paired.Pairing's, and `referee_twin` (the incumbent's pair copy: said as `twin` is, or null)."""
        return {**super().counts(), "referee_twin": self.referee_twin.said() if self.referee_twin else None}

    def offer_prompt(self, prompt: list[int], max_tokens: int) -> None:
        """A live generation ended: keep its prompt for a pair when one is wanted and the budget allows."""
        if not self._open or self._slot is not None or not prompt:
            return
        self.offered += 1
        if not self.within_budget():
            self.over_budget += 1
            return
        self._slot = {"prompt": list(prompt)}
        self._ready.set()

    def _timed(self, session: Any, feeds: dict[str, Any]) -> float | None:
        """One greedy generation on `session` (a GenerativeModel): its seconds per token, None when not measured.
        A generation whose runtime threads waited for the cores (the runtime returned no figure) sets `_contended`:
        paired.Pairing._clean runs that half again while the mirrored CPU stays within its share; one refused by
        the KV budget or failing is not run again."""
        self.runs += 1
        self._contended = False
        spent, cost = None, 0.0
        try:
            spent, cost = tpot(session, feeds["prompt"], self.tokens, self.cpu)
            self._contended = spent is None
        except ServerBusy:
            pass  # the KV budget is full of client streams: the pair is dropped, no client waits for it
        except Exception:  # noqa: BLE001 - a failing mirrored generation is counted, not raised
            self.failed += 1
        self._last[id(session)] = time.perf_counter()
        self.mirrored_s += cost
        return spent
