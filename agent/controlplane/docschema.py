"""The shape of every document a device supplies (enrollment request, decision record with its attestation
envelopes, conformance report, status over MQTT), as pydantic models with strict types: checked at the edge
(`check`: 422 naming the field, nothing stored) and again when a stored one is read (`clean`: a bad field is
blanked and named under "invalid", so one bad row written before these checks, or straight into the database,
never breaks a listing or a page). Unknown fields are kept (newer devices add some); known ones are typed."""

from __future__ import annotations

import copy
import json
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator

from agent.controlplane.limits import depth
from agent.errors import EdgeAgentError

MAX_DEPTH = 32  # a stored document nested deeper is not shown (limits.json_depth bounds new ones)
INVALID = "invalid"  # the key naming the fields blanked on read

Short = Annotated[str, Field(max_length=64)]  # what lands in a String(64) column
Text = Annotated[str, Field(max_length=4096)]


class DocumentInvalid(EdgeAgentError):
    """A device document whose fields do not have their types (HTTP 422 at the edge; nothing is stored)."""


class Doc(BaseModel):
    model_config = ConfigDict(extra="allow", strict=True)


def _hardware(value: Any, info: ValidationInfo) -> Any:
    """`hardware`: a flat object (at most 32 keys of at most 64 characters) of strings of at most 256 characters,
    numbers, booleans, null, or lists of at most 32 of those; as compact JSON at most `hardware_bytes`."""
    if value is None:
        return value
    if not isinstance(value, dict):
        raise ValueError("expected an object")
    if len(value) > 32:
        raise ValueError(f"{len(value)} keys, more than 32")
    for key, v in value.items():
        if len(key) > 64:
            raise ValueError(f"{key[:64]!r}...: a key of more than 64 characters")
        if isinstance(v, list) and len(v) > 32:
            raise ValueError(f"{key}: a list of more than 32 values")
        for x in v if isinstance(v, list) else [v]:
            if not (x is None or isinstance(x, (bool, int, float)) or (isinstance(x, str) and len(x) <= 256)):
                raise ValueError(
                    f"{key}: expected a string of at most 256 characters, a number, a boolean, null or a list of those"
                )
    cap = (info.context or {}).get("hardware_bytes")
    if cap is not None and len(json.dumps(value, separators=(",", ":"))) > cap:
        raise ValueError(f"more than {cap} bytes as JSON")
    return value


class EnrollRequest(Doc):
    kind: str | None = None
    device_id: str | None = Field(default=None, max_length=200)  # the name rule names a bad one (enroll.check)
    public_key: str | None = Field(default=None, max_length=4096)
    nonce: str | None = Field(default=None, max_length=200)
    ts: float | None = None
    hardware: Any = None
    target: Short | None = None
    token: str | None = Field(default=None, max_length=256)
    sig: dict[str, Text | None] | None = None

    _hw = field_validator("hardware")(_hardware)


class Independent(Doc):
    max_rel: float | None = None  # an own-golden row against onnx's reference evaluator (qualify.owngolden)


class Accuracy(Doc):
    max_rel: float | None = None
    independent: Independent | None = None


class Latency(Doc):
    p50: float | None = None
    p99: float | None = None


class Point(Doc):
    """One shape point's latency (agent.qualify.points.entry): what the device page shows of it."""

    point: Short | None = None
    inputs: Text | None = None
    source: Text | None = None
    p50: float | None = None
    p90: float | None = None
    p99: float | None = None
    runs: int | None = None
    stopped: Text | None = None
    skipped: Text | None = None


class DecisionRowDoc(Doc):
    """One row of a device's decision record, as the service checks it (the qualifying side: agent.qualify.decision.Row)."""

    key: Text | None = None
    provider: Text | None = None
    precision: Text | None = None
    status: Text | None = None
    reason: str | None = None
    coverage: float | None = None
    accuracy: Accuracy | None = None
    latency_ms: Latency | None = None
    memory_peak_bytes: int | float | None = None
    contended: bool | None = None
    conditions: dict[str, Any] | None = None
    latency_points: Annotated[list[Point], Field(max_length=16)] | None = None
    accuracy_basis: Short | None = None  # "own golden (not independent)" (agent.qualify.owngolden)


class DecisionDoc(Doc):
    """A device's decision record, as the service checks it (the qualifying side: agent.qualify.decision.Decision)."""

    results: Annotated[list[DecisionRowDoc], Field(max_length=512)] | None = None
    selected: Text | None = None
    selected_precision: Text | None = None
    reason: str | None = None
    model: dict[str, Any] | None = None


class Signed(Doc):
    device_id: Short | None = None
    model: Short | None = None
    version: Short | None = None
    ts: float | None = None
    sig: dict[str, Text | None] | None = None


class Summary(Doc):
    model: Text | None = None
    version: Text | None = None
    verdict: Text | None = None
    selected: Text | dict[str, Any] | None = None
    digest: dict[str, Text | None] | None = None
    attested_at: float | None = None


class Attestation(Doc):
    """As a device sends it (a DSSE envelope) or as the service keeps it (its verdict with the envelope)."""

    payloadType: Text | None = None
    payload: str | None = None
    signatures: list[dict[str, Any]] | None = None
    verified: bool | None = None
    reason: str | None = None
    summary: Summary | None = None
    envelope: dict[str, Any] | None = None


class DecisionRecord(Signed):
    deployment_id: Annotated[str, Field(max_length=160)] | None = None
    decision: DecisionDoc | None = None
    trial: dict[str, Any] | None = None
    attestations: Annotated[dict[Annotated[str, Field(max_length=32)], Attestation], Field(max_length=16)] | None = None


class ConformanceReport(Signed):
    summary: dict[str, Any] | str | None = None


class ModelStatus(Doc):
    version: Short | None = None
    provider: Short | None = None
    precision: Short | None = None
    state: Short | None = None
    reason: str | None = None


Ratio = Annotated[float, Field(ge=0, le=1e6, allow_inf_nan=False)]  # a time ratio: finite, not negative
# a bound is null where the device had too few pairs for it (agent/trial/pairjudge.py: not measured)
Interval = Annotated[list[Ratio | None], Field(min_length=2, max_length=2)]
Pairs = Annotated[int, Field(ge=0, le=10**9)]


class PairedSide(Doc):
    """A ratio of paired timings with its confidence interval and the number of pairs (agent.fleet.paired)."""

    ratio: Ratio | None = None
    ci: Interval | None = None
    pairs: Pairs | None = None


class Paired(PairedSide):
    """The trial's paired timing: candidate / incumbent, the A/A floor (incumbent / incumbent), the conditions
    the pairs were taken under (a flat object, like `hardware`), the verdict and its reason."""

    aa: PairedSide | None = None
    conditions: Any = None
    verdict: Literal["slower", "not slower", "not judged"] | None = None
    reason: Text | None = None

    _conditions = field_validator("conditions")(_hardware)


class Trial(Doc):
    paired: Paired | None = None


class DeploymentStatus(Doc):
    version: Short | None = None
    state: Short | None = None
    result: Short | None = None
    reason: str | None = None
    paired: Paired | None = None  # where a device reports it (agent.fleet.paired reads both)
    probation: Trial | None = None
    shadow: Trial | None = None


class Status(Doc):
    device_id: Short | None = None
    online: bool | None = None
    ts: float | None = None
    target: Short | None = None
    hardware: Any = None
    providers: Annotated[list[Short], Field(max_length=64)] | None = None
    models: dict[Short, ModelStatus] | None = None
    deployments: dict[Short, DeploymentStatus] | None = None

    _hw = field_validator("hardware")(_hardware)


KINDS: dict[str, type[Doc]] = {
    "enroll": EnrollRequest,
    "decision": DecisionRecord,
    "conformance": ConformanceReport,
    "status": Status,
}


def _problems(errors: list[Any]) -> list[str]:
    out = []
    for e in errors:
        loc = ".".join(str(p) for p in e.get("loc", ()))
        out.append(f"{loc or 'document'}: {e.get('msg')}")
    return out


def check(kind: str, doc: Any, hardware_bytes: int | None = None) -> None:
    """DocumentInvalid naming each field whose type or size is wrong (a body's depth is checked before)."""
    try:
        KINDS[kind].model_validate(doc, context={"hardware_bytes": hardware_bytes})
    except ValidationError as exc:
        raise DocumentInvalid(f"{kind} document: " + "; ".join(_problems(exc.errors())[:10])) from None


def _blank(doc: Any, loc: tuple[Any, ...]) -> bool:
    """Blank the deepest existing part of `loc`: a dict's value to None (or away when it is None already), a
    list's element away. False when nothing could be blanked."""
    parent: Any = None
    key: Any = None
    here = doc
    for part in loc:
        if isinstance(here, dict) and part in here:
            parent, key, here = here, part, here[part]
        elif isinstance(here, list) and isinstance(part, int) and 0 <= part < len(here):
            parent, key, here = here, part, here[part]
        else:
            break
    if parent is None:
        return False
    if isinstance(parent, list):
        del parent[key]
    elif parent[key] is None:
        del parent[key]
    else:
        parent[key] = None
    return True


def clean(kind: str, doc: Any, passes: int = 64) -> dict[str, Any]:
    """A stored document as it may be shown: its badly typed fields blanked and named under "invalid" (a
    document that is no object, or nested too deep, becomes {"invalid": [why]})."""
    if not isinstance(doc, dict):
        return {INVALID: [f"document: expected an object, got {type(doc).__name__}"]}
    if depth(doc, MAX_DEPTH) > MAX_DEPTH:
        return {INVALID: [f"document: nested deeper than {MAX_DEPTH} levels"]}
    model, out, problems = KINDS[kind], None, []
    for _ in range(passes):
        try:
            model.model_validate(out if out is not None else doc)
            return out if out is not None else doc
        except ValidationError as exc:
            out = out if out is not None else copy.deepcopy(doc)
            first = exc.errors()[0]
            problems += _problems([first])
            if not _blank(out, tuple(first.get("loc", ()))):
                break
            out[INVALID] = problems
    return {INVALID: problems}


def hardware(value: Any) -> tuple[dict[str, Any], list[str]]:
    """A stored `hardware` as it may be shown, or {} with why not."""
    if value is None:
        return {}, []
    got = clean("status", {"hardware": value})
    if INVALID in got:
        return {}, [p for p in got[INVALID]]
    return got["hardware"] or {}, []
