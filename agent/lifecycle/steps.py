"""Steps: the action of each lifecycle state for one device (store, slots, registry, qualification)."""

from __future__ import annotations

import shutil
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.config import ProbationConfig, ServingConfig, ShadowConfig
from agent.errors import EdgeAgentError, LifecycleError
from agent.lifecycle import actions as act
from agent.lifecycle import integrity, repair, unloaded
from agent.lifecycle.journal import Deployment, Journal
from agent.lifecycle.perms import harden
from agent.lifecycle.qualifier import run_qualification
from agent.lifecycle.qualqueue import QualificationQueue
from agent.lifecycle.slots import ModelSlots, gc
from agent.lifecycle.sources import NEEDS_SOURCE, InboxSource, missing_source
from agent.lifecycle.states import Event, State
from agent.util.atomic import atomic_write_json

Measure = Callable[[], dict[str, Any]]
# (deployment, context, measure) -> Decision.to_dict(); measure() runs the real qualification child process
Qualifier = Callable[[Deployment, act.StepContext, Measure], dict[str, Any]]

ENTRY_KEYS = (
    "version",
    "sha256",
    "model_sha256",
    "provider",
    "precision",
    "requested_precision",
    "options",
    "device",
    "cache_dir",
    "versions",
    "package_dir",
    "model_path",
    "latency_ms",
    "deployment_id",
    "variant",
    "input_specs",
    "contended",
    "requalified",
    "memory_peak_bytes",
    "session_s",
    "optimization",
)


@dataclass
class StepConfig:
    """Tunables of the lifecycle actions (tests shorten probation and the latency budget)."""

    probation_s: float | None = None  # None: ServingConfig's default (the daemon fills in serving.probation_s)
    build_nice: int | None = None  # new versions build this many nice levels below serving (None: as probation_s)
    providers: list[str] | None = None  # qualify only these (default: the target's preference order)
    qualify_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"latency_budget_s": 1.0}
    swap: str | None = None  # make-before-break | stop-then-start (forced; default: the target's rule below)
    serving: dict[str, Any] = field(default_factory=dict)  # the target's serving hints (swap, swap_when_memory_short)
    keep_deployments: int = 20
    memory_max: int | None = None  # bytes one model may use (serving.memory_max resolved; None: no bound)
    deadlines: dict[str, float] = field(default_factory=dict)  # state name -> seconds (overrides the defaults)
    stall_s: float = 30.0  # a pull with no progress this long fails its attempt (then retried with backoff)
    probation: ProbationConfig | None = None  # None: serving.probation (the daemon fills it in)
    shadow: ShadowConfig | None = None  # None: serving.shadow (the daemon fills it in)
    model_trust: Any = None  # agent.artifacts.modelsig.ModelTrust: packages must carry a trusted model signature


class Steps:
    """Runs one state's action and names the event it ends with. Also restores serving from the slots."""

    def __init__(
        self,
        state_dir: Path,
        store,
        registry,
        *,
        profile: Any = None,
        target_name: str | None = None,
        config: StepConfig | None = None,
        journal: Journal | None = None,
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
        self.on_note: Callable[[str, str], None] | None = None
        # Deployment sources by source.kind (lifecycle.sources.DeploymentSource); MQTT mode adds "manifest".
        self.sources: dict[str, Any] = {"inbox": InboxSource(store, self.journal, self.staging)}
        # Optional: wraps the measurement (the fleet simulator shares one result among identical devices).
        self.qualifier: Qualifier | None = None
        self.attestor: Any = None  # agent.evidence.attest.Attestor: signs decisions and trial verdicts
        self._model_locks: dict[str, threading.Lock] = {}
        self._baselines: dict[str, Any] = {}  # model -> the incumbent's Baseline taken at its last swap

    def add_source(self, source: Any) -> None:
        self.sources[source.kind] = source

    def source_ready(self, dep: Deployment) -> bool:
        """May this deployment's next action run now? Only a state that talks to the source waits for it; a
        kind without a source runs (and is refused with the reason)."""
        src = self.sources.get(dep.source.get("kind", ""))
        return dep.state.value not in NEEDS_SOURCE or src is None or src.ready()

    def download_mark(self, dep: Deployment) -> int:
        """Chunks of this deployment's artifact on disk (persisted bitmap): recovery's progress mark."""
        from agent.artifacts.staging import persisted_chunks

        sha = ((dep.data.get("manifest") or {}).get("artifact") or {}).get("sha256")
        return persisted_chunks(self.store, sha) if sha else 0

    def model_lock(self, name: str) -> threading.Lock:
        return self._model_locks.setdefault(name, threading.Lock())

    # ---- dispatch ------------------------------------------------------------------------------
    def run(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        handler = {
            State.RECEIVED: self.on_received,
            State.DOWNLOADING: self.on_downloading,
            State.VERIFYING: self.on_verifying,
            State.QUALIFYING: self.on_qualifying,
            State.ACTIVATING: self.on_activating,
            State.PROBATION: self.on_probation,
        }.get(dep.state)
        if handler is None:
            raise LifecycleError(f"no action for state {dep.state.value}")
        return handler(dep, ctx)

    def on_received(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        kind = dep.source.get("kind")
        if kind == "rollback":
            return Event.ROLLBACK, {}
        if kind == "requalify":  # the committed artifact measured again after a runtime change (drift)
            if not self.store.has(dep.data.get("sha256") or ""):
                raise LifecycleError("the committed artifact is no longer in the store: cannot re-qualify")
            return Event.ACCEPT, {}
        source = self.sources.get(kind) if isinstance(kind, str) else None
        if source is None:
            raise act.Rejected(missing_source(kind))
        source.check(dep)
        return Event.ACCEPT, {}

    def on_downloading(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        sha = dep.data.get("sha256")
        if sha and self.store.has(sha) and dep.data.get("fetched"):
            return Event.FETCHED, {}
        source = self.sources.get(dep.source.get("kind", ""))
        if source is None:
            raise LifecycleError(f"no source {dep.source.get('kind')!r} configured to fetch from")
        got = source.fetch(dep, ctx)
        return Event.FETCHED, {**got, "fetched": True}

    def on_verifying(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        # the package check (checker + shape inference in a child) waits in the qualification queue: one native
        # child at a time, never beside a timed row; the state's deadline does not run while it waits
        with self.qualify_queue.turn(f"check {dep.model} {dep.version} ({dep.id})", ctx) as turn:
            if ctx.deadline is not None:
                ctx.deadline += turn["queued_s"]
            got = act.verify(
                self.store,
                dep.data["sha256"],
                self.packages,
                ctx,
                memory_max=self.config.memory_max,
                before_check=self._signature,
            )
        integrity.record(got["package_dir"])  # what start-up checks the unpacked files against
        return Event.VERIFIED, got

    def on_qualifying(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        cache_root = str(self.state_dir / "cache")

        window: dict[str, Any] = {}

        def measure() -> dict[str, Any]:
            with self.qualify_queue.turn(f"{dep.model} {dep.version} ({dep.id})", ctx) as turn:
                if ctx.deadline is not None:  # the state's deadline is for measuring, not for waiting in line
                    ctx.deadline += turn["queued_s"]
                ctx.report("qualify_start", queued_s=turn["queued_s"])
                self.registry.gate.busy(True)  # no serving run is measured for CPU time meanwhile (rungate.py)
                try:
                    return run_qualification(
                        dep.data["package_dir"],
                        self.profile,
                        self.target_name,
                        cache_root,
                        ctx,
                        providers=self.config.providers,
                        options=self.config.qualify_options,
                        overrides=(dep.data.get("manifest") or {}).get("qualification"),
                        nice=_or(self.config.build_nice, ServingConfig.build_nice),
                        memory_max=self.config.memory_max,
                        answers={"serving_requests": self.serving_requests},
                    )
                finally:
                    self.registry.gate.busy(False)
                    window.update(turn, finished=time.time())
                    ctx.report("qualify_end", seconds=round(window["finished"] - window["started"], 3))

        decision = self.qualifier(dep, ctx, measure) if self.qualifier is not None else measure()
        atomic_write_json(self.state_dir / "decisions" / f"{dep.id}.json", decision, mode=0o600)
        self._attest(dep, "qualification", decision)
        summary = _summary(decision)
        guessed = shapes_guessed(decision)
        if not decision.get("selected") and guessed:  # the fix first: the runtimes' errors follow from the guess
            raise LifecycleError(f"{guessed}; on those shapes no provider passed: {brief_failures(decision)}")
        if not decision.get("selected"):
            raise LifecycleError(f"no provider passed qualification: {summary['why']}")
        if guessed:
            raise LifecycleError(guessed)
        row = _selected_row(decision)
        note = self._requalified_note(dep, decision)
        selected = {
            "provider": decision["selected"],
            "precision": row.get("precision"),
            "requested_precision": row.get("requested_precision"),
            "options": row.get("options") or {},
            "device": row.get("device"),
            "cache_dir": row.get("cache_dir"),
            "latency_ms": row.get("latency_ms") or {},
            "versions": row.get("versions") or {},
            "contended": bool(row.get("contended")),
            "memory_peak_bytes": row.get("memory_peak_bytes"),
            "session_s": row.get("session_s") or {},
            "optimization": row.get("optimization"),
            "input_specs": (decision.get("model") or {}).get("inputs") or [],
            **({"requalified": note} if note else {}),
        }
        if row.get("variant"):  # a package of variants: serve exactly the file that won (and its cache key)
            selected.update(
                variant=row["variant"], model_path=row.get("model_path"), model_sha256=row.get("model_sha256")
            )
        window = {k: window[k] for k in ("queued_s", "started", "finished") if k in window}
        return Event.QUALIFIED, {"decision": summary, "selected": selected, "qualification": window}

    def _requalified_note(self, dep: Deployment, decision: dict[str, Any]) -> str:
        """For a drift re-qualification: what changed and, when the provider changes, why the old one lost."""
        if dep.source.get("kind") != "requalify":
            return ""
        was = dep.source.get("provider")
        note = f"re-qualified after {dep.source.get('drift') or 'a runtime change'}"
        if was and decision.get("selected") != was:
            lost = (decision.get("losers") or {}).get(was) or "no longer passes"
            note += f": {was} -> {decision.get('selected')} ({was}: {lost})"
        return note

    def drifted(self) -> list[tuple[str, dict[str, Any], str]]:
        """Start-up: committed models whose decision was made under other runtime/provider/driver versions,
        as (name, committed entry, what changed); each is marked stale until re-qualified."""
        from agent.qualify import caches

        current = caches.runtime_versions(self.profile)
        out = []
        for name in self.slots.names():
            entry = self.slots.get(name)["committed"]
            drift = caches.version_drift((entry or {}).get("versions"), current) if entry else {}
            if drift:
                text = caches.drift_text(drift)
                self.stale[name] = f"decided under other versions ({text}); re-qualifying in the background"
                out.append((name, entry, text))
        return out

    def serving_requests(self) -> int:
        """Requests served so far by every model here (the qualification child asks, to record the load)."""
        return sum(int(s.snapshot().get("requests") or 0) for s in self.registry.all_stats())

    def on_activating(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        with self.model_lock(dep.model):
            if dep.source.get("kind") == "rollback":
                slots = self.slots.get(dep.model)
                if (slots["committed"] or {}).get("sha256") == dep.data.get("sha256"):
                    self._serve(dep.model, slots["committed"])  # swapped before a crash: just serve it
                    return Event.SWAPPED, {}
                if (slots["previous"] or {}).get("sha256") != dep.data.get("sha256"):
                    raise LifecycleError("the previous slot changed; nothing to roll back to")
                swap = self._report_swap(slots["previous"], ctx)
                done = self._serve(dep.model, slots["previous"], swap["mode"])  # the slots change once it serves
                self.slots.swap(dep.model)
                return Event.SWAPPED, {"swap": {**swap, "build": done.get("build_priority")}}
            entry = self.entry(dep)
            swap = self._report_swap(entry, ctx)
            rehearsal = self._rehearsal(dep.model, swap["mode"], entry)
            try:
                done = self._serve(
                    dep.model,
                    entry,
                    swap["mode"],
                    nice=_or(self.config.build_nice, ServingConfig.build_nice),
                    before_swap=rehearsal.before_swap(ctx),
                )
            finally:
                if rehearsal.figures is not None:  # journaled and in the decision record, passed or not
                    dep.data["shadow"] = rehearsal.figures
                    self.journal.save(dep)
                    self._record_decision(dep.id, shadow=rehearsal.figures)
            self._baselines[dep.model] = rehearsal.baseline
        timings = done.get("timings") or {}
        if timings:  # session creation and time to first answer of the swap, beside the qualification's figures
            self._record_decision(dep.id, swap_timings=timings)
        swapped = {**swap, "build": done.get("build_priority"), **timings}
        return Event.ACTIVATED, {"swap": swapped, "shadow": rehearsal.figures}

    def _rehearsal(self, name: str, mode: str, entry: dict[str, Any]):
        from agent.lifecycle.watch import Rehearsal, shadow_skip_reason
        from agent.serving.probation import compute_measure

        shadow = self.config.shadow or ShadowConfig()
        window = _or(self.config.probation_s, ServingConfig.probation_s)
        measure = compute_measure(entry.get("provider"), entry.get("device"))
        r = Rehearsal(self.registry, name, shadow, self.config.probation or ProbationConfig(), window, measure)
        why = shadow_skip_reason(self.registry, name, mode, shadow)
        if why:
            r.skip(why)
        r.take_baseline()  # stop-then-start has no before_swap: the incumbent's runs up to now
        return r

    def _record_decision(self, dep_id: str, **extra: Any) -> None:
        """Add `extra` to the deployment's decision record (decisions/<id>.json), when there is one."""
        import json

        path = self.state_dir / "decisions" / f"{dep_id}.json"
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            return
        atomic_write_json(path, {**doc, **extra})

    def _report_swap(self, entry: dict[str, Any], ctx: act.StepContext) -> dict[str, str]:
        mode, why = self.swap_mode(entry)
        ctx.report("swap_mode", mode=mode, why=why)
        return {"mode": mode, "why": why}

    def swap_mode(self, entry: dict[str, Any]) -> tuple[str, str]:
        """make-before-break or stop-then-start for this activation: forced by config, else the target's rule
        (`swap_when_memory_short`) against MemAvailable and the model's size on disk."""
        from agent.serving.memory import choose_swap, mem_available

        if self.config.swap:
            return self.config.swap, f"{self.config.swap} (set by configuration)"
        peak = entry.get("memory_peak_bytes")  # measured by qualification (session, warm-up, timed runs)
        if peak:
            return choose_swap(self.config.serving, int(peak), mem_available(), "measured peak")
        return choose_swap(self.config.serving, _model_bytes(entry), mem_available(), "size on disk")

    def on_probation(self, dep: Deployment, ctx: act.StepContext) -> tuple[Event, dict[str, Any]]:
        from agent.lifecycle.watch import probation_watch
        from agent.serving.probation import TROUBLE

        window = _or(self.config.probation_s, ServingConfig.probation_s)
        config = self.config.probation or ProbationConfig()
        state, reason, figures = probation_watch(
            self.registry, dep, ctx, window, config, self._baselines.pop(dep.model, None), self.config.serving
        )
        self._record_decision(dep.id, probation=figures)
        ctx.report("probation", verdict=state, reason=reason, **figures)
        if state == TROUBLE:
            return Event.TROUBLE, {"reason": reason, "probation": figures}
        with self.model_lock(dep.model):
            self.slots.commit(dep.model, self.entry(dep))
            self.stale.pop(dep.model, None)
        self._gc()
        return Event.PASSED, {"probation": figures}

    def finished(self, dep: Deployment) -> None:
        """A deployment ended: its inbox directory (if still there) is consumed so it is not picked up again;
        a failed re-qualification leaves the model serving, stale, with the reason; old terminal records beyond
        keep_deployments per model are compacted away (the journal stays bounded)."""
        if dep.source.get("kind") == "inbox" and dep.source.get("path"):
            shutil.rmtree(dep.source["path"], ignore_errors=True)
        if dep.source.get("kind") == "requalify" and dep.state is not State.COMMITTED and dep.model in self.stale:
            self.stale[dep.model] = (
                f"decided under other versions ({dep.source.get('drift')}); re-qualification "
                f"{dep.state.value}: {dep.reason}; still serving the old decision"
            )
        if dep.state in (State.COMMITTED, State.ROLLED_BACK) or (dep.state is State.FAILED and "selected" in dep.data):
            self._attest(dep, "trial", dep.state.value, dep.reason)
        harden(self.state_dir)
        try:
            keep = {e.get("deployment_id") for e in _slot_entries(self.slots) if e}
            self.journal.prune(self.config.keep_deployments, keep_ids={k for k in keep if k})
        except (OSError, LifecycleError):
            pass  # compacted at the next end

    def _signature(self, package_dir: Path) -> dict[str, Any]:
        """The package's OpenSSF model signature, when this device requires one (agent.artifacts.modelsig)."""
        trust = self.config.model_trust
        if trust is None or not trust.enabled:
            return {}
        from agent.artifacts.modelsig import verify_package

        return {"model_signature": verify_package(package_dir, trust)}

    def _attest(self, dep: Deployment, kind: str, *args: Any) -> None:
        """Sign the qualification decision or the trial verdict (agent.evidence); a failure is a note, never
        the deployment's failure."""
        if self.attestor is None:
            return
        try:
            getattr(self.attestor, kind)(dep, *args)
        except Exception as exc:  # noqa: BLE001 - evidence must not break the lifecycle
            if self.on_note is not None:
                self.on_note(dep.model, f"{kind} attestation not written: {exc}")

    # ---- serving from slots --------------------------------------------------------------------
    def entry(self, dep: Deployment) -> dict[str, Any]:
        d = {**dep.data, **(dep.data.get("selected") or {})}
        d.update(version=dep.version, deployment_id=dep.id)
        return {k: d.get(k) for k in ENTRY_KEYS}

    def _serve(
        self, name: str, entry: dict[str, Any], swap: str | None = None, nice: int = 0, before_swap=None
    ) -> dict[str, Any]:
        """Build, warm and swap in `entry`. New versions build `nice` levels below serving; restores and
        rollbacks build at serving priority (getting back to a good model comes first)."""
        note = repair.verify_unpacked(self.store, self.packages, entry)  # raises repair.Corrupt
        if note:
            self.note(name, note)
        if swap is None:
            swap = self.swap_mode(entry)[0]
        keep = before_swap is not None and (self.config.probation or ProbationConfig()).referee
        result = act.activate(
            self.registry,
            name,
            self._fresh_cache(entry),
            swap=swap,
            lock=self.session_lock,
            build_nice=nice,
            before_swap=before_swap,
            keep_previous=keep,
        )
        self.unavailable.pop(name, None)
        return result

    def _fresh_cache(self, entry: dict[str, Any]) -> dict[str, Any]:
        """A runtime upgrade since qualification changes the cache key: never load a stale compiled blob."""
        from agent.qualify import caches

        stored = entry.get("versions") or {}
        if not entry.get("cache_dir") or not entry.get("model_sha256"):
            return entry
        current = caches.runtime_versions(self.profile)
        if all(stored.get(k) == v for k, v in current.items()):
            return entry
        versions = {**stored, **current}
        fresh = caches.cache_dir_for(self.state_dir / "cache", entry["model_sha256"], entry["provider"], versions)
        return {**entry, "cache_dir": str(fresh), "versions": versions}

    def restore_all(self) -> None:
        """Start-up: serve every committed slot, verified (the previous one when the committed cannot load);
        an unreadable slots.json is rebuilt from the journal."""
        for name in self.slots.names():
            try:
                self.slots.get(name)
            except LifecycleError as exc:
                why = str(exc).split(": ", 1)[-1]
                self.note(name, repair.rebuild_slots(self.slots, self.journal, name, self.entry, why))
            if unloaded.held(self.state_dir, name, self.slots.get(name)["committed"]):
                continue  # stopped by the operator (repository unload): stays stopped across restarts
            self.ensure_committed(name)

    def note(self, name: str, reason: str) -> None:
        """A repair or fallback worth telling: kept for the status document and handed to on_note (the log)."""
        self.notes[name] = reason
        if self.on_note is not None:
            self.on_note(name, reason)

    def ensure_committed(self, name: str) -> None:
        """Make the registry serve the committed slot of `name` (after a failure or rollback)."""
        with self.model_lock(name):
            slots = self.slots.get(name)
            entry = slots["committed"]
            meta = self._serving_meta(name)
            if entry is None:
                if meta is not None:
                    self.registry.deactivate(name)
                return
            if meta and meta.get("sha256") == entry.get("sha256") and meta.get("version") == entry["version"]:
                return
            if self._reinstate(name, entry):
                return
            try:
                self._serve(name, entry)
            except repair.Corrupt as exc:
                self._fall_back(name, slots, exc)
            except EdgeAgentError as exc:
                self._serve_degraded(name, entry, exc)

    def _fall_back(self, name: str, slots: dict[str, Any], exc: Exception) -> None:
        """The committed entry's files are damaged beyond repair: serve the previous slot, which becomes the
        committed one (the damaged version can simply be pushed again), with the reason."""
        prev = slots["previous"]
        if not prev:
            self.unavailable[name] = f"committed {exc}; no previous version to fall back to"
            self.note(name, self.unavailable[name])
            return
        try:
            self._serve(name, prev)
        except EdgeAgentError as again:
            self.unavailable[name] = f"committed {exc}; previous version {prev['version']} failed too: {again}"
            self.note(name, self.unavailable[name])
            return
        self.slots.swap(name)
        self.note(name, f"committed {exc}; serving the previous version {prev['version']} instead")

    def _reinstate(self, name: str, entry: dict[str, Any]) -> bool:
        """Roll back to the referee (the committed version's session, kept through the swap) when it is this
        entry's: no build, no compile. False when there is none (then the slot is built again)."""
        version = self.registry.referee(name)
        if version != entry["version"]:
            if version is not None:
                self.registry.drop_referee(name)
            return False
        done = self.registry.reinstate_referee(name, version)
        if done is None:
            return False
        meta = self._serving_meta(name) or {}
        if meta.get("sha256") != entry.get("sha256"):
            return False  # same label, another package: the caller builds the committed one
        self.unavailable.pop(name, None)
        return True

    def _serve_degraded(self, name: str, entry: dict[str, Any], exc: Exception) -> None:
        """The committed provider fails (driver gone, device busy): keep the model up on plain CPU, say so."""
        why = f"committed version {entry['version']} cannot be served on {entry.get('provider')}: {exc}"
        if entry.get("provider") != "cpu":
            cpu = {
                **entry,
                "provider": "cpu",
                "options": {},
                "requested_precision": None,
                "device": None,
                "cache_dir": None,
                "precision": None,
            }
            try:
                self._serve(name, cpu)
                self.unavailable[name] = f"degraded: {why}; serving on cpu (not qualified) until the next deployment"
                return
            except EdgeAgentError as cpu_exc:
                why += f"; cpu fallback failed too: {cpu_exc}"
        self.unavailable[name] = why

    def _serving_meta(self, name: str) -> dict[str, Any] | None:
        try:
            e = self.registry.entry(name)
        except EdgeAgentError:
            return None
        return {**e.meta, "version": e.version}

    def _gc(self) -> None:
        keep = self.slots.referenced()
        in_flight = self.journal.in_flight()
        for dep in in_flight:
            artifact = ((dep.data.get("manifest") or {}).get("artifact") or {}).get("sha256")
            keep.update(v for v in (dep.data.get("sha256"), dep.data.get("model_sha256"), artifact) if v)
        # ContentStore.gc also clears staging/: never while another model's deployment may be writing there
        fetching = any(d.state in (State.RECEIVED, State.DOWNLOADING) for d in in_flight)
        try:
            if not fetching:
                gc(self.state_dir, self.store, keep)
        except (OSError, EdgeAgentError):
            pass  # garbage stays until the next commit
        self.journal.prune(
            self.config.keep_deployments,
            keep_ids={
                e["deployment_id"] for e in _slot_entries(self.slots) if e and e.get("deployment_id") is not None
            },
        )
        ids = {d.id for d in self.journal.all()}
        for p in (self.state_dir / "decisions").glob("*.json"):
            if p.stem not in ids:
                p.unlink(missing_ok=True)


def _slot_entries(slots: ModelSlots) -> list[dict[str, Any]]:
    """Every committed/previous entry of the readable slot files."""
    out = []
    for name in slots.names():
        try:
            out += [e for e in slots.get(name).values() if e]
        except LifecycleError:
            continue
    return out


def _model_bytes(entry: dict[str, Any]) -> int:
    """What a session of this model needs at least: the size of its files (weights dominate)."""
    path = entry.get("model_path")
    if not path:
        return 0
    root = Path(path).parent
    try:  # the graph and its external weights; golden test data does not load into the session
        return sum(
            p.stat().st_size
            for p in root.rglob("*")
            if p.is_file() and not any(part.startswith("test_data") for part in p.relative_to(root).parts)
        )
    except OSError:
        return 0


def _clean_leftovers(packages: Path, staging: Path) -> None:
    for p in packages.glob(".*.tmp"):
        shutil.rmtree(p, ignore_errors=True)
    for p in staging.iterdir():
        p.unlink(missing_ok=True)


def _selected_row(decision: dict[str, Any]) -> dict[str, Any]:
    key = decision.get("selected_key") or decision.get("selected")
    for row in decision.get("results", []):
        if row.get("key", row.get("provider")) == key:
            return row
    return next((r for r in decision.get("results", []) if r.get("provider") == decision.get("selected")), {})


def shapes_guessed(decision: dict[str, Any]) -> str:
    """Why a decision measured on guessed shapes cannot go live ("" when every shape was declared)."""
    assumed = decision.get("assumed_shapes") or {}
    if not assumed:
        return ""
    dims = "; ".join(f"input {name!r}: {', '.join(f'{d}={v}' for d, v in ds.items())}" for name, ds in assumed.items())
    return (
        f"shapes guessed at qualification ({dims}): the daemon does not activate a model measured on assumed "
        "shapes; add input_shapes (a shape, or min/opt/max) or dynamic_dims to model.yaml, or a "
        "test_data_set_0 with real inputs"
    )


def brief_failures(decision: dict[str, Any], width: int = 160) -> str:
    """The failed rows' reasons, each once (rows failing the same way are named together), cut to `width`."""
    by_reason: dict[str, list[str]] = {}
    for r in decision.get("results", []):
        reason = " ".join(str(r.get("reason") or r.get("status")).split())
        reason = reason if len(reason) <= width else reason[: width - 3] + "..."
        by_reason.setdefault(reason, []).append(str(r.get("provider")))
    return "; ".join(f"{', '.join(p)}: {why}" for why, p in by_reason.items()) or "no candidate provider"


def _summary(decision: dict[str, Any]) -> dict[str, Any]:
    rows = [
        {
            "provider": r.get("provider"),
            "precision": r.get("precision"),
            "status": r.get("status"),
            "reason": r.get("reason"),
            "p50_ms": (r.get("latency_ms") or {}).get("p50"),
            **({"variant": r["variant"]} if r.get("variant") else {}),
        }
        for r in decision.get("results", [])
    ]
    why = "; ".join(
        f"{(r['variant'] + '/') if r.get('variant') else ''}{r['provider']}: {r['status']} ({r['reason']})"
        for r in rows
    )
    why = why or "no candidate provider"
    return {
        "selected": decision.get("selected"),
        "selected_precision": decision.get("selected_precision"),
        "selected_variant": decision.get("selected_variant"),
        "reason": decision.get("reason"),
        "rows": rows,
        "why": why if not decision.get("selected") else decision.get("reason"),
    }


def _or(value, default):
    return default if value is None else value
