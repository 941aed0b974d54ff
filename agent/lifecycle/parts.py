"""Parts: what every lifecycle stage of one device works with (store, slots, journal, registry, settings)."""

from __future__ import annotations

import json
import shutil
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import ServingConfig
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment, Journal
from agent.lifecycle.qualqueue import QualificationQueue
from agent.lifecycle.slots import ADDED_KEYS, ENTRY_KEYS, ModelSlots, SlotEntry
from agent.trial.settings import ProbationConfig, ShadowConfig
from agent.util.atomic import atomic_write_json

Measure = Callable[[], dict[str, Any]]
# (deployment, context, measure) -> Decision.to_dict(); measure() runs the real qualification child process
Qualifier = Callable[[Deployment, StepContext, Measure], dict[str, Any]]
NoteSink = Callable[[str, str], None]


@dataclass(frozen=True)
class StepConfig:
    """Tunables of the lifecycle actions, resolved once (agent.settings: file, environment, target)."""

    probation_s: float | None = None  # None: ServingConfig's default (settings fill in serving.probation_s)
    build_nice: int | None = None  # new versions build this many nice levels below serving (None: as probation_s)
    providers: list[str] | None = None  # qualify only these (default: the target's preference order)
    qualify_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"latency_budget_s": 1.0}
    swap: str | None = None  # make-before-break | stop-then-start (forced; default: the target's rule below)
    serving: dict[str, Any] = field(default_factory=dict)  # the target's serving hints (swap, swap_when_memory_short)
    keep_deployments: int = 20
    memory_max: int | None = None  # bytes one model may use (serving.memory_max resolved; None: no bound)
    deadlines: dict[str, float] = field(default_factory=dict)  # state name -> seconds (overrides the defaults)
    stall_s: float = 30.0  # a pull with no progress this long fails its attempt (then retried with backoff)
    probation: ProbationConfig | None = None  # None: serving.probation (settings fill it in)
    shadow: ShadowConfig | None = None  # None: serving.shadow (settings fill it in)
    model_trust: Any = None  # agent.artifacts.modelsig.ModelTrust: packages must carry a trusted model signature

    @property
    def window_s(self) -> float:
        """The probation window (and the shadow's baseline window) in seconds."""
        return ServingConfig.probation_s if self.probation_s is None else self.probation_s

    @property
    def nice(self) -> int:
        """Nice levels below serving that new versions build at."""
        return ServingConfig.build_nice if self.build_nice is None else self.build_nice

    @property
    def trial(self) -> ProbationConfig:
        return self.probation or ProbationConfig()

    @property
    def rehearsal(self) -> ShadowConfig:
        return self.shadow or ShadowConfig()


class Parts:
    """One device's lifecycle parts on a state_dir; the stages (agent.lifecycle.stages) and the restore action
    read and change them. Ports come in through the constructor: nothing is wired by assignment."""

    def __init__(
        self,
        state_dir: Path,
        store: Any,
        registry: Any,
        *,
        profile: Any = None,
        target_name: str | None = None,
        config: StepConfig | None = None,
        journal: Journal | None = None,
        qualifier: Qualifier | None = None,
        on_note: NoteSink | None = None,
        attestor: Any = None,
    ):
        self.state_dir = Path(state_dir)
        self.store, self.registry, self.profile, self.target_name = store, registry, profile, target_name
        self.config = config or StepConfig()
        self.slots = ModelSlots(self.state_dir)
        self.journal = journal or Journal(self.state_dir)
        self.packages = self.state_dir / "packages"
        self.staging = self.state_dir / "tmp"  # pack temp files (the store owns staging/)
        for d in (self.packages, self.staging, self.state_dir / "cache", self.state_dir / "decisions"):
            d.mkdir(parents=True, exist_ok=True)
        _clean_leftovers(self.packages, self.staging)  # start-up: nothing is unpacking or packing yet
        self.session_lock = threading.Lock()
        self.qualify_queue = QualificationQueue()  # one qualification at a time on this device
        self.unavailable: dict[str, str] = {}  # model -> why its committed slot is not serving
        self.stale: dict[str, str] = {}  # model -> why its decision no longer matches this device's runtimes
        self.notes: dict[str, str] = {}  # model -> last repair or fallback at start-up (status shows it)
        self.on_note = on_note
        # Deployment sources by source.kind (lifecycle.ports.DeploymentSource): "inbox", MQTT mode's "manifest".
        self.sources: dict[str, Any] = {}
        # Optional: wraps the measurement (the fleet simulator shares one result among identical devices).
        self.qualifier = qualifier
        self.attestor = attestor  # agent.evidence.attest.Attestor: signs decisions and trial verdicts
        self._model_locks: dict[str, threading.Lock] = {}
        # model -> the Rehearsal of its last swap (stages.watch): the incumbent's Baseline and the shadow's pairs
        self.rehearsals: dict[str, Any] = {}

    def add_source(self, source: Any) -> None:
        self.sources[source.kind] = source

    def model_lock(self, name: str) -> threading.Lock:
        return self._model_locks.setdefault(name, threading.Lock())

    def note(self, name: str, reason: str) -> None:
        """A repair or fallback worth telling: kept for the status document and handed to on_note (the log)."""
        self.notes[name] = reason
        if self.on_note is not None:
            self.on_note(name, reason)

    def entry(self, dep: Deployment) -> SlotEntry:
        """The slot entry this deployment commits: what it fetched and verified, and the selected row."""
        d = {**dep.data, **(dep.data.get("selected") or {})}
        d.update(version=dep.version, deployment_id=dep.id)
        return SlotEntry.from_data({k: d.get(k) for k in (*ENTRY_KEYS, *ADDED_KEYS)})

    def record_decision(self, dep_id: str, **extra: Any) -> None:
        """Add `extra` to the deployment's decision record (decisions/<id>.json), when there is one."""
        path = self.state_dir / "decisions" / f"{dep_id}.json"
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return
        atomic_write_json(path, {**doc, **extra})

    def attest(self, dep: Deployment, kind: str, *args: Any) -> None:
        """Sign the qualification decision or the trial verdict (agent.evidence); a failure is a note, never
        the deployment's failure."""
        if self.attestor is None:
            return
        try:
            getattr(self.attestor, kind)(dep, *args)
        except Exception as exc:  # noqa: BLE001 - evidence must not break the lifecycle
            if self.on_note is not None:
                self.on_note(dep.model, f"{kind} attestation not written: {exc}")

    def serving_meta(self, name: str) -> dict[str, Any] | None:
        from agent.errors import EdgeAgentError

        try:
            e = self.registry.entry(name)
        except EdgeAgentError:
            return None
        return {**e.meta, "version": e.version}


def _clean_leftovers(packages: Path, staging: Path) -> None:
    for p in packages.glob(".*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    for p in staging.iterdir():
        p.unlink(missing_ok=True)
