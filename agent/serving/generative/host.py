"""The generative models this daemon serves, by name, and the swap between versions (docs/generative.md, "Swap and
probation"). A new version loads beside the serving one; swap() makes it the one new requests get (between
requests: a request takes its model when it starts); a generation in flight holds its own model object and finishes
on the version it started on. The swapped-out version is kept as the referee while a probation judges the new one
(paired TPOT, agent.trial.genpaired): reinstate() serves it again without a load, drop_referee() lets it go."""

from __future__ import annotations

import threading
from dataclasses import replace
from pathlib import Path

from agent.serving.errors import InvalidInput
from agent.serving.generative.engine import (
    ORT_GENAI,
    OV_GENAI,
    EngineSpec,
    GenerativeModel,
)
from agent.serving.generative.kvbudget import KVBudget
from agent.serving.generative.pacing import DEFAULT_STREAM_INTERVAL_S

DEFAULT_KV_BUDGET = 256 * 2**20


class GenerativeHost:
    def __init__(self) -> None:
        self.budget = KVBudget(DEFAULT_KV_BUDGET)
        self.models: dict[str, GenerativeModel] = {}  # what new requests get; the routes read this dict
        self.referees: dict[str, GenerativeModel] = {}  # the incumbent kept through a probation
        self.stream_interval_s = DEFAULT_STREAM_INTERVAL_S
        self._lock = threading.Lock()

    def configure(
        self,
        kv_budget: int,
        max_streams: int = 8,
        queue_s: float = 0.0,
        stream_interval_s: float = DEFAULT_STREAM_INTERVAL_S,
    ) -> None:
        """serving.generative's budget and stream pace, for every model served now and later (set at start,
        before requests)."""
        self.budget = KVBudget(kv_budget, max_streams, queue_s)
        self.stream_interval_s = stream_interval_s
        for m in (*self.models.values(), *self.referees.values()):
            m.budget, m.stream_interval_s = self.budget, stream_interval_s

    def load(
        self, name: str, version: str, model_dir: Path, provider: str, spec: EngineSpec | None = None
    ) -> GenerativeModel:
        """Load a version beside what serves, by its package's runtime (`spec`; default onnxruntime-genai): the
        engine raises when the runtime cannot load it."""
        from agent.serving import rungate

        before = rungate.native_tids()
        model = load_engine(name, model_dir, provider, self.budget, str(version), spec or EngineSpec())
        model.stream_interval_s = self.stream_interval_s
        rungate.claim(model, before)  # the runtime threads its load started are its own (CPU time of pairs)
        return model

    def copy(self, model: GenerativeModel) -> GenerativeModel:
        """`model` loaded again for a trial's paired TPOT only (EngineSpec.pair_copy; trial/twin.py): never served,
        let go with close()."""
        return self.load(
            model.name, model.version, model.model_dir, model.provider, replace(model.spec, pair_copy=True)
        )

    def swap(self, name: str, model: GenerativeModel, keep_previous: bool = False) -> GenerativeModel | None:
        """New requests get `model` from now on; the one it replaces is kept as the referee when asked."""
        with self._lock:
            old = self.models.get(name)
            if old is not None:  # the metrics and live prompts are the model name's: they go on across versions
                model.stats, model.recent = old.stats, old.recent
            self.models[name] = model
            dropped = self.referees.pop(name, None)
            if keep_previous and old is not None:
                self.referees[name] = old
        _let_go(dropped)
        return old

    def version(self, name: str) -> str | None:
        m = self.models.get(name)
        return None if m is None else m.version

    def referee(self, name: str) -> GenerativeModel | None:
        return self.referees.get(name)

    def reinstate(self, name: str, version: str) -> bool:
        """Serve the referee again when it is `version` (a rollback without a load); False when there is none."""
        with self._lock:
            ref = self.referees.get(name)
            if ref is None or ref.version != str(version):
                return False
            out = self.models.get(name)
            self.models[name] = self.referees.pop(name)
        _let_go(out)
        return True

    def drop_referee(self, name: str) -> None:
        with self._lock:
            ref = self.referees.pop(name, None)
        _let_go(ref)

    def let_go(self, model: GenerativeModel) -> None:
        """A loaded version that was never swapped in (its shadow refused it)."""
        _let_go(model)

    def remove(self, name: str) -> None:
        """Stop serving `name` (a first deployment rolled back): new requests get 404."""
        with self._lock:
            gone = [self.models.pop(name, None), self.referees.pop(name, None)]
        for m in gone:
            _let_go(m)


def load_engine(
    name: str, model_dir: Path, provider: str, budget: KVBudget, version: str, spec: EngineSpec
) -> GenerativeModel:
    """The engine of `spec.runtime` (ModelUnavailable when the runtime is not installed)."""
    if spec.runtime == OV_GENAI:
        from agent.serving.generative.ovgenai import OVGenaiModel

        return OVGenaiModel(name, model_dir, provider, budget, version, spec)
    if spec.runtime != ORT_GENAI:
        raise InvalidInput(f"{name}: runtime {spec.runtime!r} is not served (served: {ORT_GENAI}, {OV_GENAI})")
    from agent.serving.generative.ortgenai import OrtGenaiModel

    return OrtGenaiModel(name, model_dir, provider, budget, version)


def _let_go(model: GenerativeModel | None) -> None:
    """A version nobody serves any more: its runtime threads are no longer claimed. Generations in flight hold
    the object, so it is freed when the last of them ends."""
    if model is not None:
        model.close()
