"""The lifecycle scenario table: the executable spec of what a fault at each state does to a deployment.

One row = one scenario, as Mender's state tests are table-driven: version 1 serves (committed), version 2 is
deployed with a fault injected at one state (an error a step raises, a process restart, a cancel, a newer
version, a corrupt artifact, a failing qualification, shadow or probation, a full disk, a deadline), and the
row names the journal history version 2 must end with, the version serving afterwards and a substring of the
reason. Everything runs in this process with the real parts: Orchestrator, Steps, ContentStore, ModelRegistry,
the journal on disk, onnxruntime sessions of tiny models made with onnx.helper. Faults come in through ports
(a Steps subclass that runs the real action around the fault, the Steps journal/store constructor arguments,
a deployment source, the qualifier hook): nothing is monkeypatched.

The expectations come from the lifecycle's rules (docs/daemon.md), not from a recording of what the code did:
- a fault before the swap fails the deployment and leaves what serves untouched (the same session object);
- activation is make-before-break: a fault there fails it and the committed version serves again;
- a fault in probation (the new version serves) rolls back to the committed version, which serves again;
- a restart resumes received/downloading/verifying/qualifying in place (the state appears twice) and commits;
  a restart during activation or probation counts against the new version (rolled back), unless the commit
  had landed before the crash;
- a transient download failure is retried (same history as the happy path); one that outlasts the state's
  deadline fails retryably; a newer version supersedes the one in flight, which then commits.
"""

from __future__ import annotations

import errno
import json
import shutil
import threading
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from agent.artifacts.store import ContentStore
from agent.errors import LifecycleError, TransportError
from agent.lifecycle.context import StepContext
from agent.lifecycle.journal import Deployment, Journal, check_history
from agent.lifecycle.orchestrator import Orchestrator
from agent.lifecycle.recovery import MAX_ATTEMPTS
from agent.lifecycle.retry import retry_transient
from agent.lifecycle.states import ORDER, TERMINAL, State
from agent.lifecycle.steps import StepConfig, Steps
from agent.lifecycle.table import ENTRY_ACTIONS, RESTORE, TRANSITIONS
from agent.serving.registry import ModelRegistry
from agent.sources.inbox import InboxSource
from agent.trial.settings import ProbationConfig, ShadowConfig

S = State
MODEL = "tiny"
WAIT_S = 120.0  # generous bounds for a busy machine; nothing here asserts on time
HAPPY = ORDER  # received .. committed
BEFORE = {S.RECEIVED, S.DOWNLOADING, S.VERIFYING, S.QUALIFYING}  # nothing swapped yet
RESUMABLE = (S.RECEIVED, S.DOWNLOADING, S.VERIFYING, S.QUALIFYING)
IN_FLIGHT = (*RESUMABLE, S.ACTIVATING, S.PROBATION)


# ---- the table ------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Scenario:
    name: str
    fault: str  # what goes wrong (FAULTS below says how each is injected)
    at: State | None  # the state of version 2 in which it goes wrong
    history: tuple[State, ...]  # version 2's journaled states, in order
    serving: str  # the version serving afterwards
    reason: str = ""  # substring of version 2's final reason ("" : no reason expected)
    then: tuple[State, ...] = ()  # the history of version 3 (supersede) or of the rollback deployment
    retryable: bool = False  # version 2 failed for a transient reason (the same desired state may come again)


def upto(state: State, *end: State) -> tuple[State, ...]:
    """The happy path up to and including `state`, then `end`."""
    return (*HAPPY[: HAPPY.index(state) + 1], *end)


def resumed(state: State) -> tuple[State, ...]:
    """The happy path with `state` journaled twice (entered, then resumed after the restart)."""
    i = HAPPY.index(state)
    return (*HAPPY[: i + 1], state, *HAPPY[i + 1 :])


def _abort(state: State) -> State:
    return S.ROLLED_BACK if state is S.PROBATION else S.FAILED


SCENARIOS: list[Scenario] = [
    Scenario("happy path", "none", None, HAPPY, "2"),
    # a step's action fails for good: before the swap nothing changes; probation's failure rolls back
    *[
        Scenario(f"permanent error in {s}", "permanent", s, upto(s, _abort(s)), "1", f"{s.value}: injected permanent")
        for s in IN_FLIGHT
    ],
    # a bug (an unexpected exception type) in any stage fails the deployment, never the daemon
    *[Scenario(f"bug in {s}", "bug", s, upto(s, _abort(s)), "1", "RuntimeError: injected") for s in IN_FLIGHT],
    # a stage fails after its real action ran: the restore action (entry of failed / rolled_back) puts the
    # committed version back where the action had swapped the new one in; a landed commit stays
    *[
        Scenario(
            f"restore after a failure once {s} ran",
            "permanent-after",
            s,
            HAPPY if s is S.PROBATION else upto(s, _abort(s)),
            "2" if s is S.PROBATION else "1",
            "the slot commit had landed" if s is S.PROBATION else f"{s.value}: injected permanent",
        )
        for s in IN_FLIGHT
    ],
    # the state's deadline passes
    *[
        Scenario(f"deadline in {s}", "timeout", s, upto(s, _abort(s)), "1", f"{s.value} exceeded its deadline")
        for s in IN_FLIGHT
    ],
    # the process dies in a state (the orchestrator stops mid-state, a new one starts on the same state_dir)
    *[Scenario(f"restart in {s} resumes and commits", "restart", s, resumed(s), "2") for s in RESUMABLE],
    Scenario(
        "restart loop in qualifying gives up",
        "restart-loop",
        S.QUALIFYING,
        (*upto(S.QUALIFYING), S.QUALIFYING, S.QUALIFYING, S.FAILED),
        "1",
        "crash loop",
    ),
    Scenario(
        "restart in activating rolls back",
        "restart",
        S.ACTIVATING,
        upto(S.ACTIVATING, S.ROLLED_BACK),
        "1",
        "daemon restarted during activating",
    ),
    Scenario(
        "restart in activating after the swap rolls back",
        "restart-after",
        S.ACTIVATING,
        upto(S.ACTIVATING, S.ROLLED_BACK),
        "1",
        "daemon restarted during activating",
    ),
    Scenario(
        "restart in probation rolls back",
        "restart",
        S.PROBATION,
        upto(S.PROBATION, S.ROLLED_BACK),
        "1",
        "a crash during probation counts against the new model",
    ),
    Scenario("restart after probation's commit landed commits", "restart-after", S.PROBATION, HAPPY, "2"),
    # the operator cancels, in every in-flight state
    *[Scenario(f"cancel in {s}", "cancel", s, upto(s, _abort(s)), "1", "cancelled by operator") for s in IN_FLIGHT],
    Scenario(
        "cancel in activating after the swap",
        "cancel-after",
        S.ACTIVATING,
        upto(S.ACTIVATING, S.FAILED),
        "1",
        "cancelled by operator",
    ),
    # version 3 arrives while version 2 is in flight, in every in-flight state: 2 is called off, 3 commits
    *[
        Scenario(f"superseded in {s}", "supersede", s, upto(s, _abort(s)), "3", "superseded by version 3", then=HAPPY)
        for s in IN_FLIGHT
    ],
    # what the real parts find wrong
    Scenario(
        "source refused", "unknown-source", S.RECEIVED, (S.RECEIVED, S.REJECTED), "1", "unknown deployment source"
    ),
    Scenario("transient download failure retries", "transient", S.DOWNLOADING, HAPPY, "2"),
    Scenario(
        "transient download failure outlasts the deadline",
        "transient-forever",
        S.DOWNLOADING,
        upto(S.DOWNLOADING, S.FAILED),
        "1",
        "gave up after",
        retryable=True,
    ),
    Scenario(
        "disk full while storing the artifact",
        "disk-full-store",
        S.DOWNLOADING,
        upto(S.DOWNLOADING, S.FAILED),
        "1",
        "No space left on device",
    ),
    Scenario(
        "corrupt artifact in the store", "corrupt", S.VERIFYING, upto(S.VERIFYING, S.FAILED), "1", "hash mismatch"
    ),
    Scenario(
        "qualification fails (outputs differ from the golden data)",
        "bad-golden",
        S.QUALIFYING,
        upto(S.QUALIFYING, S.FAILED),
        "1",
        "no provider passed qualification",
    ),
    Scenario(
        "shadow phase disagrees with the incumbent",
        "shadow-disagrees",
        S.ACTIVATING,
        upto(S.ACTIVATING, S.FAILED),
        "1",
        "max_rel",
    ),
    Scenario(
        "disk full journaling the entry into probation",
        "disk-full-journal",
        S.ACTIVATING,
        upto(S.ACTIVATING, S.FAILED),
        "1",
        "internal error: OSError",
    ),
    Scenario(
        "disk full journaling the commit: the slot commit had landed",
        "disk-full-journal",
        S.PROBATION,
        HAPPY,
        "2",
        "the slot commit had landed",
    ),
    Scenario(
        "cancel in probation after the slot commit landed is too late",
        "cancel-after",
        S.PROBATION,
        HAPPY,
        "2",
        "the slot commit had landed",
    ),
    Scenario("probation sees NaN/Inf outputs", "nan", S.PROBATION, upto(S.PROBATION, S.ROLLED_BACK), "1", "NaN/Inf"),
    Scenario(
        "operator rollback after the commit",
        "rollback",
        S.COMMITTED,
        HAPPY,
        "1",
        then=(S.RECEIVED, S.ACTIVATING, S.COMMITTED),
    ),
]


# ---- injection ----------------------------------------------------------------------------------------


@dataclass
class Fault:
    """What ScenarioSteps does in one state of one version: before or after the real action runs."""

    state: State
    version: str = "2"
    when: str = "before"  # before | after (the real action has run, its event is not journaled yet)
    error: BaseException | None = None  # raised
    hold: bool = False  # wait (honouring cancel and deadline) until released
    corrupt: bool = False  # overwrite the artifact blob in the store
    entered: threading.Event = field(default_factory=threading.Event)
    release: threading.Event = field(default_factory=threading.Event)
    fired: bool = False


class ScenarioSteps(Steps):
    """The real Steps with one injected fault around the real action of a state."""

    def __init__(self, *args: Any, fault: Fault | None = None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.fault = fault

    def run(self, dep: Deployment, ctx: StepContext):
        f = self.fault
        mine = f is not None and not f.fired and f.state is dep.state and f.version == dep.version
        if mine and f.when == "before":
            self._fire(f, dep, ctx)
        result = super().run(dep, ctx)
        if mine and f.when == "after":
            self._fire(f, dep, ctx)
        return result

    def _fire(self, f: Fault, dep: Deployment, ctx: StepContext) -> None:
        f.fired = True
        if f.corrupt:
            blob = Path(self.store.path(dep.data["sha256"]))
            blob.chmod(0o600)
            blob.write_bytes(b"not the artifact that was fetched")
        f.entered.set()
        if f.error is not None:
            raise f.error
        while f.hold and not f.release.is_set():
            ctx.check()  # a cancel, a supersede, a stop or the deadline ends the hold
            ctx.cancel.wait(0.02)


class FlakyInbox(InboxSource):
    """The inbox source behind a link that fails transiently `failures` times (-1: always), retried the way
    MqttSource.fetch retries a pull (lifecycle.retry.retry_transient, the fetch module's classification)."""

    def __init__(self, *args: Any, failures: int):
        super().__init__(*args)
        self.failures, self.attempts = failures, 0

    def fetch(self, dep: Deployment, ctx: StepContext) -> dict[str, Any]:
        from agent.artifacts.fetch import is_transient

        def attempt() -> dict[str, Any]:
            self.attempts += 1
            if self.failures < 0 or self.attempts <= self.failures:
                raise TransportError(f"broker unreachable (attempt {self.attempts})")
            return InboxSource.fetch(self, dep, ctx)

        return retry_transient(attempt, ctx, transient=is_transient, until=None, what="download", base=0.2, cap=0.4)


class FullStore(ContentStore):
    """A content store on a full disk: storing a file fails with ENOSPC."""

    def put_file(self, *args: Any, **kwargs: Any) -> str:
        raise OSError(errno.ENOSPC, "No space left on device")


class FullOnceJournal(Journal):
    """A journal whose write of a record entering `state` fails once with ENOSPC (the disk filled up, then
    something was freed)."""

    def __init__(self, state_dir: Path, state: State):
        super().__init__(state_dir)
        self.state, self.failed = state, False

    def save(self, dep: Deployment, new: bool = False) -> None:
        if dep.state is self.state and not self.failed:
            self.failed = True
            raise OSError(errno.ENOSPC, "No space left on device")
        super().save(dep, new=new)


# ---- the rig ------------------------------------------------------------------------------------------


def step_config(**changes: Any) -> StepConfig:
    base = StepConfig(
        probation_s=0.3,
        providers=["cpu"],
        qualify_options={"latency_budget_s": 0.1, "isolate": False},
        swap="make-before-break",
        probation=ProbationConfig(),
        shadow=ShadowConfig(duration_s=2.0),
    )
    return replace(base, **changes)


class SharedQualification:
    """The qualifier port used as the fleet simulator uses it: the real measurement once per model file, the
    decision reused for identical packages (paths moved to the state_dir asking)."""

    def __init__(self) -> None:
        self.decisions: dict[str, tuple[str, str]] = {}  # model sha256 -> (state_dir, decision json)

    def for_dir(self, state_dir: Path):
        def qualify(dep: Deployment, ctx: StepContext, measure) -> dict[str, Any]:
            key = dep.data.get("model_sha256") or ""
            if key in self.decisions:
                where, doc = self.decisions[key]
                return json.loads(doc.replace(json.dumps(where)[1:-1], json.dumps(str(state_dir))[1:-1]))
            decision = measure()
            self.decisions[key] = (str(state_dir), json.dumps(decision))
            return decision

        return qualify


class Device:
    """One device's lifecycle parts on a state_dir, as DeviceAgent composes them (without HTTP or MQTT)."""

    def __init__(self, state_dir: Path, shared: SharedQualification, *, fault: Fault | None = None, **kw: Any):
        from agent.targets import detect_device

        self.state_dir, self.shared = state_dir, shared
        self.config = kw.pop("config", None) or step_config()
        store_cls = kw.pop("store_cls", ContentStore)
        journal = kw.pop("journal", None)
        self.store = store_cls(state_dir, file_mode=0o600)
        self.registry = ModelRegistry()
        self.steps = ScenarioSteps(
            state_dir,
            self.store,
            self.registry,
            profile=_profile(detect_device),
            target_name="generic-x86_64",
            config=self.config,
            journal=journal,
            fault=fault,
            qualifier=shared.for_dir(state_dir),
        )
        source = kw.pop("source", None) or InboxSource
        self.steps.add_source(source(self.store, self.steps.staging))
        self.events: list[dict[str, Any]] = []
        self.orch = Orchestrator(
            state_dir, self.steps, deadlines=kw.pop("deadlines", None), listeners=[self.events.append]
        )
        self.orch.start()

    def drop(self, version: str, writer=None) -> Path:
        from agent.samples import sample_tiny_package

        path = self.state_dir / "inbox" / MODEL / version
        (writer or (lambda d: sample_tiny_package(d, name=MODEL, version=version)))(path)
        return path

    def deploy(self, version: str, writer=None, source: dict[str, Any] | None = None) -> Deployment:
        src = source or {"kind": "inbox", "path": str(self.drop(version, writer))}
        dep = self.orch.submit(MODEL, version, src)
        assert dep is not None
        return dep

    def wait(self, dep: Deployment) -> Deployment:
        return self.orch.wait(dep.id, WAIT_S)

    def serving(self) -> str | None:
        return self.registry.models().get(MODEL)

    def stop(self) -> None:
        self.orch.stop(timeout=WAIT_S)
        self.registry.close(5.0)


_PROFILE: list[Any] = []


def _profile(detect):
    if not _PROFILE:
        _PROFILE.append(detect(root="/"))
    return _PROFILE[0]


class Traffic:
    """Clients of the registry: one request after another with input value `x` until stopped."""

    def __init__(self, registry: ModelRegistry, x: float):
        self.registry, self.feeds = registry, {"x": np.full((1, 4), x, np.float32)}
        self.answers: dict[str, int] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                version, _ = self.registry.infer(MODEL, self.feeds)
                self.answers[version] = self.answers.get(version, 0) + 1
            except Exception:  # noqa: BLE001 - a request during a swap may fail; the verdicts count what matters
                pass
            self._stop.wait(0.002)

    def __enter__(self) -> "Traffic":
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join(10)


def bad_golden(path: Path) -> None:
    """A package whose model does not compute its own golden outputs (y = x + 9 against goldens of x + 2)."""
    import onnx

    from agent.samples import tiny_model, write_package

    write_package(path, tiny_model(2.0), name=MODEL, version="2")
    onnx.save(tiny_model(9.0), str(path / "model.onnx"))


def inf_at_five(path: Path) -> None:
    """y = x / (x - 5): finite on the golden data, Inf for the input 5 (where version 1 answers 6)."""
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    from agent.samples import write_package

    graph = helper.make_graph(
        [helper.make_node("Sub", ["x", "five"], ["d"]), helper.make_node("Div", ["x", "d"], ["y"])],
        "inf_at_five",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, [1, 4])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, [1, 4])],
        [numpy_helper.from_array(np.full((4,), 5.0, np.float32), "five")],
    )
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    write_package(path, model, name=MODEL, version="2")


@pytest.fixture(scope="module")
def shared() -> SharedQualification:
    return SharedQualification()


@pytest.fixture(scope="module")
def committed_v1(tmp_path_factory, shared) -> Path:
    """A state_dir where version 1 was deployed and committed (copied for each scenario)."""
    state = tmp_path_factory.mktemp("base") / "state"
    dev = Device(state, shared)
    try:
        dep = dev.wait(dev.deploy("1"))
        assert dep.state is S.COMMITTED, dep.reason
    finally:
        dev.stop()
    return state


def copy_state(base: Path, dest: Path) -> Path:
    """The committed state_dir moved to `dest` (the journal and slots name their files by absolute path)."""
    shutil.copytree(base, dest, symlinks=True)
    old, new = json.dumps(str(base))[1:-1], json.dumps(str(dest))[1:-1]
    for p in dest.rglob("*.json"):
        text = p.read_text()
        if old in text:
            p.write_text(text.replace(old, new))
    return dest


# ---- the runner ---------------------------------------------------------------------------------------


def fault_for(sc: Scenario) -> tuple[Fault | None, dict[str, Any]]:
    """The injected fault and the Device arguments of one row."""
    kw: dict[str, Any] = {}
    at = sc.at
    if sc.fault in ("none", "rollback", "unknown-source", "bad-golden", "disk-full-journal"):
        return None, kw
    if sc.fault == "permanent":
        return Fault(at, error=LifecycleError("injected permanent fault")), kw
    if sc.fault == "bug":
        return Fault(at, error=RuntimeError("injected")), kw
    if sc.fault == "permanent-after":
        return Fault(at, error=LifecycleError("injected permanent fault"), when="after"), kw
    if sc.fault == "timeout":
        return Fault(at, hold=True), {"deadlines": {at: 0.5}}
    if sc.fault in ("restart", "restart-loop", "cancel", "supersede"):
        return Fault(at, hold=True), kw
    if sc.fault in ("restart-after", "cancel-after"):
        return Fault(at, hold=True, when="after"), kw
    if sc.fault == "corrupt":
        return Fault(at, corrupt=True), kw
    if sc.fault == "transient":
        return None, {"source": lambda *a: FlakyInbox(*a, failures=2)}
    if sc.fault == "transient-forever":
        return None, {"source": lambda *a: FlakyInbox(*a, failures=-1), "deadlines": {S.DOWNLOADING: 1.5}}
    if sc.fault == "disk-full-store":
        return None, {"store_cls": FullStore}
    if sc.fault == "shadow-disagrees":
        shadow = ShadowConfig(duration_s=10.0, requests=20, min_requests=5, cpu_share=1.0, max_rel=0.01)
        return None, {"config": step_config(shadow=shadow)}
    if sc.fault == "nan":
        return None, {"config": step_config(probation_s=1.0, shadow=ShadowConfig(enabled=False))}
    raise AssertionError(f"no injection for fault {sc.fault!r}")


def run_scenario(sc: Scenario, base: Path, tmp_path: Path, shared: SharedQualification) -> dict[str, Any]:
    state = copy_state(base, tmp_path / "state")
    fault, kw = fault_for(sc)
    if sc.fault == "disk-full-journal":  # fails writing the state after `at`
        assert sc.at is not None
        kw["journal"] = FullOnceJournal(state, HAPPY[HAPPY.index(sc.at) + 1])
    dev = Device(state, shared, fault=fault, **kw)
    incumbent = dev.registry.entry(MODEL)
    out: dict[str, Any] = {"incumbent_untouched": None, "then": None}
    try:
        assert dev.serving() == "1"
        writer = {"bad-golden": bad_golden, "nan": inf_at_five}.get(sc.fault)
        source = {"kind": "ftp", "url": "ftp://example.invalid/tiny-2"} if sc.fault == "unknown-source" else None
        traffic_x = {"nan": 5.0, "shadow-disagrees": 0.0}.get(sc.fault)
        traffic = Traffic(dev.registry, traffic_x) if traffic_x is not None else None
        if traffic is not None:
            traffic.__enter__()
        try:
            dep = dev.deploy("2", writer, source)
            if sc.fault in ("restart", "restart-after"):
                assert fault is not None and fault.entered.wait(WAIT_S), "the fault was never reached"
                dev.stop()  # the process dies here: nothing after this point is journaled
                dev = Device(state, shared)  # a new process on the same state_dir
            elif sc.fault == "restart-loop":  # it dies in the same state at every start
                for _ in range(MAX_ATTEMPTS):
                    assert fault is not None and fault.entered.wait(WAIT_S), "the fault was never reached"
                    dev.stop()
                    fault = replace(fault, entered=threading.Event(), fired=False)
                    dev = Device(state, shared, fault=fault)
            elif sc.fault in ("cancel", "cancel-after"):
                assert fault is not None and fault.entered.wait(WAIT_S), "the fault was never reached"
                assert dev.orch.cancel(MODEL) is not None
            elif sc.fault == "supersede":
                assert fault is not None and fault.entered.wait(WAIT_S), "the fault was never reached"
                newer = dev.deploy("3")
            dep = dev.wait(dep)
            if sc.fault == "supersede":
                out["then"] = dev.wait(newer)
            if sc.fault == "rollback":
                out["then"] = dev.orch.rollback(MODEL, wait=WAIT_S)
        finally:
            if traffic is not None:
                traffic.__exit__()
        if fault is not None and not sc.fault.startswith("restart"):
            assert fault.fired, "the fault was never injected"
        out["dep"] = dev.orch.journal.load(dep.id)
        out["serving"] = dev.serving()
        out["committed"] = getattr(dev.steps.slots.committed(MODEL), "version", None)
        try:
            out["incumbent_untouched"] = dev.registry.entry(MODEL) is incumbent
        except Exception:  # noqa: BLE001 - nothing serves: the assertion on `serving` says so
            out["incumbent_untouched"] = False
        out["events"] = list(dev.events)
        out["steps"] = dev.steps
    finally:
        dev.stop()
    return out


@pytest.mark.parametrize("sc", SCENARIOS, ids=[s.name for s in SCENARIOS])
def test_scenario(sc: Scenario, committed_v1: Path, tmp_path: Path, shared: SharedQualification) -> None:
    got = run_scenario(sc, committed_v1, tmp_path, shared)
    dep: Deployment = got["dep"]
    states = tuple(S(h["state"]) for h in dep.history)
    assert states == sc.history, f"history {[s.value for s in states]}; reason: {dep.reason}"
    assert check_history(dep) == []  # every step is an edge of the table
    assert got["serving"] == sc.serving, dep.reason
    assert got["committed"] == sc.serving  # the slot and the registry agree
    if sc.reason:
        assert dep.reason is not None and sc.reason in dep.reason, dep.reason
    elif sc.history[-1] is S.COMMITTED:
        assert dep.reason is None, dep.reason
    assert bool(dep.data.get("retryable")) == sc.retryable, dep.data
    last_live = sc.history[-2]
    # (a restart builds a new registry: the same session object cannot survive it)
    if (
        sc.history[-1] in (S.FAILED, S.REJECTED)
        and last_live in BEFORE
        and sc.serving == "1"
        and not sc.fault.startswith("restart")
    ):
        assert got["incumbent_untouched"], "a failure before the swap rebuilt or replaced what serves"
    if sc.then:
        then: Deployment = got["then"]
        assert tuple(S(h["state"]) for h in then.history) == sc.then, then.reason
    if sc.fault == "transient":
        retries = [e for e in got["events"] if e.get("progress") == "retry" and e.get("deployment_id") == dep.id]
        assert len(retries) == 2 and "broker unreachable" in retries[0]["reason"], retries


# ---- the table covers the lifecycle -------------------------------------------------------------------


def test_the_table_covers_every_state():
    """Every state a deployment can be in while in flight has a fault row, a bug, a failure after its action
    (the restore action), a cancel, a supersede and a deadline; every resumable state a restart; every terminal
    state is some row's outcome."""
    live = {s for (s, _e) in TRANSITIONS} - TERMINAL
    assert live == set(IN_FLIGHT)
    for fault in ("permanent", "bug", "permanent-after", "cancel", "supersede", "timeout"):
        assert {sc.at for sc in SCENARIOS if sc.fault == fault} == live, fault
    assert {sc.at for sc in SCENARIOS if sc.fault.startswith("restart")} == live
    outcomes = {sc.history[-1] for sc in SCENARIOS} | {sc.then[-1] for sc in SCENARIOS if sc.then}
    assert outcomes == {S.COMMITTED, S.FAILED, S.ROLLED_BACK, S.REJECTED}
    assert len({sc.name for sc in SCENARIOS}) == len(SCENARIOS)
    # the restore action is the table's entry action of both aborted outcomes
    assert ENTRY_ACTIONS == {S.FAILED: RESTORE, S.ROLLED_BACK: RESTORE}
