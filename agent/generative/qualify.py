"""Qualify a generative package: a row per runtime, provider and variant (precision), each measured in its own
process (agent.generative.rowproc), judged against the fp32 CPU reference (agent.generative.fidelity) and the
package's gates; the fastest passing row (TPOT p50) is selected. Returns the decision record (a dict)."""

from __future__ import annotations

import hashlib
import json
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.generative import fidelity
from agent.generative.ovrow import HOW_MEASURED as OV_HOW
from agent.generative.package import GenerativePackage
from agent.generative.runtimes import (
    GENAI_PROVIDERS,
    OV_DEVICES,
    genai_missing,
    openvino_genai_missing,
    other_runtime_row,
)
from agent.generative.watch import run_watched
from agent.hardware.emulation import detect_emulation

Progress = Callable[..., None]
REFERENCE = "fp32"
DEVICE_DEFAULT = "device-default"  # openvino-genai: the package's own model with the device's own precision hints


def tree_sha256(root: Path) -> str:
    """One digest over every file of the package (relative path and bytes), in path order."""
    h = hashlib.sha256()
    for p in sorted(q for q in root.rglob("*") if q.is_file()):
        h.update(str(p.relative_to(root)).encode() + b"\0")
        h.update(hashlib.sha256(p.read_bytes()).digest())
    return h.hexdigest()


GENAI_HOW = {
    "load_s": "og.Model(config) with only this provider, in the row's own process",
    "ttft_ms": "append_tokens(prompt) + the first generate_next_token, per prompt length, after a warm-up",
    "tpot_ms": "each later generate_next_token of a greedy generation of tpot_tokens, all repeats pooled",
    "peak_rss_bytes": "the row process's VmHWM after a greedy generation to max_length (KV cache at its "
    "largest); includes the runtime and the timing runs",
    "fidelity": "teacher-forced on each judge prompt + the reference's greedy continuation (gated); "
    "greedy match over the first greedy_tokens and the first divergence (reported)",
}


@dataclass(frozen=True)
class RowLimits:
    """Each row process's deadline and memory limit (None: no watchdog)."""

    timeout_s: float = 600.0
    memory_max: int | None = None


def _run_row(spec: dict[str, Any], limits: RowLimits) -> dict[str, Any]:
    out = Path(spec["out_dir"])
    out.mkdir(parents=True, exist_ok=True)
    (out / "spec.json").write_text(json.dumps(spec), encoding="utf-8")
    t0 = time.perf_counter()
    argv = [sys.executable, "-m", "agent.generative.rowproc", str(out / "spec.json")]
    code, stdout, stderr, why = run_watched(argv, limits.timeout_s, limits.memory_max)
    if why:
        return {"status": "failed" if why.startswith("memory") else "error", "reason": why}
    lines = stdout.strip().splitlines()
    if code != 0 or not lines:
        tail = (stderr.strip().splitlines() or ["no output"])[-1]
        return {"status": "error", "reason": f"the row's process exited {code}: {tail}"}
    row: dict[str, Any] = json.loads(lines[-1])
    row["wall_s"] = time.perf_counter() - t0
    return row


def _spec(pkg: GenerativePackage, model_dir: Path, provider: str, out: Path, held: Any) -> dict[str, Any]:
    t = pkg.timing
    return {
        "runtime": pkg.runtime,
        "model_dir": str(model_dir),
        "provider": provider,
        "max_length": pkg.max_length,
        "prompt_lengths": list(t["prompt_lengths"]),
        "tpot_tokens": int(t["tpot_tokens"]),
        "repeats": int(t["repeats"]),
        "greedy_tokens": int(t["greedy_tokens"]),
        "prompt_texts": pkg.prompts,
        "held": held,
        "out_dir": str(out),
    }


def _judge(row: dict[str, Any], ref: dict[str, Any], ref_dir: Path, out: Path, pkg: GenerativePackage) -> None:
    lengths = [len(p) for p in ref["prompts"]]
    row["fidelity"] = {
        **fidelity.teacher_forced(ref_dir, out, lengths),
        "greedy": fidelity.greedy(ref["greedy"], row["greedy"], int(pkg.timing["greedy_tokens"])),
    }
    if row.get("fidelity_measure"):
        row["fidelity"]["measure"] = row.pop("fidelity_measure")
    if row.get("pipeline_next") is not None:  # openvino-genai: LLMPipeline's own teacher-forced top-1 (reported)
        row["fidelity"]["pipeline_top1"] = fidelity.next_token_agreement(ref_dir, lengths, row.pop("pipeline_next"))
    why = fidelity.gate(row, pkg.gates)
    row["status"] = "failed" if why else "passed"
    row["reason"] = "; ".join(why)


def _row(
    pkg: GenerativePackage, variant: str, provider: str, work: Path, ref: dict[str, Any] | None, limits: RowLimits
) -> dict[str, Any]:
    model_dir = pkg.root if variant in (REFERENCE, DEVICE_DEFAULT) else pkg.variants[variant]
    out = work / f"{variant}-{provider}"
    spec = _spec(pkg, model_dir, provider, out, ref["held"] if ref else None)
    spec["hints"] = "default" if variant == DEVICE_DEFAULT else "fp32"
    row = {
        "runtime": pkg.runtime,
        "provider": provider,
        "precision": variant,
        "model_dir": str(model_dir),
        **_run_row(spec, limits),
    }
    if row["status"] == "unavailable":
        row["fix"] = {**GENAI_PROVIDERS, **OV_DEVICES}.get(provider) or "see the reason"
    elif row["status"] == "measured":
        if ref is None:  # this row is the reference itself
            ref = row
        _judge(row, ref, work / f"{REFERENCE}-{'CPU' if pkg.runtime == 'openvino-genai' else 'cpu'}", out, pkg)
    return row


def qualify_generative(
    pkg: GenerativePackage,
    work: Path,
    *,
    providers: list[str] | None = None,
    progress: Progress | None = None,
    limits: RowLimits = RowLimits(),
) -> dict[str, Any]:
    say = progress or (lambda *_a, **_k: None)
    rows: list[dict[str, Any]] = []
    openvino = pkg.runtime == "openvino-genai"
    missing = openvino_genai_missing() if openvino else genai_missing()
    names = list(OV_DEVICES if openvino else GENAI_PROVIDERS)
    wanted = [p for p in names if not providers or p.lower() in {q.lower() for q in providers}]
    if missing:
        rows += [{"runtime": pkg.runtime, "provider": p, "status": "unavailable", **missing} for p in wanted]
    else:
        rows += _genai_rows(pkg, work, wanted, say, limits)
    rows.append(other_runtime_row("onnxruntime-genai" if openvino else "openvino-genai", pkg.runtime))
    for r in rows:
        r["key"] = f"{r['runtime']}/{r['provider']}" + (f":{r['precision']}" if r.get("precision") else "")
    passed = [r for r in rows if r["status"] == "passed"]
    best = min(passed, key=lambda r: r["tpot_ms"]["p50_ms"]) if passed else None
    say("selected", provider=best["key"] if best else None)
    return _record(pkg, rows, best)


def _genai_rows(
    pkg: GenerativePackage, work: Path, wanted: list[str], say: Progress, limits: RowLimits
) -> list[dict[str, Any]]:
    cpu = "CPU" if pkg.runtime == "openvino-genai" else "cpu"
    say("row", provider=cpu, precision=REFERENCE, status="running")
    ref = _row(pkg, REFERENCE, cpu, work, None, limits)
    say("row", provider=cpu, precision=REFERENCE, status=ref["status"], reason=ref.get("reason"))
    rows = [ref]
    if "held" not in ref:
        return rows  # the reference was not measured: nothing else can be judged
    for provider in wanted:
        own = [REFERENCE, DEVICE_DEFAULT] if pkg.runtime == "openvino-genai" else [REFERENCE]
        for variant in [*own, *(v for v in pkg.variants if v not in own)]:
            if provider == cpu and variant == REFERENCE:
                continue
            say("row", provider=provider, precision=variant, status="running")
            row = _row(pkg, variant, provider, work, ref, limits)
            say("row", provider=provider, precision=variant, status=row["status"], reason=row.get("reason"))
            rows.append(row)
            if row["status"] == "unavailable":
                break  # the provider cannot load the reference: its other variants would say the same
    if cpu not in wanted:
        rows.remove(ref)
    return rows


def _record(pkg: GenerativePackage, rows: list[dict[str, Any]], best: dict[str, Any] | None) -> dict[str, Any]:
    for r in rows:  # the record keeps figures, not the token streams the fidelity was computed from
        for k in ("held", "prompts", "greedy", "pipeline_next"):
            r.pop(k, None)
    return {
        "kind": "generative",
        "model": {
            "name": pkg.name,
            "version": pkg.version,
            "runtime": pkg.runtime,
            "max_length": pkg.max_length,
            "sha256": tree_sha256(pkg.root),
        },
        "reference": f"the package's fp32 model on {pkg.runtime}'s CPU"
        + (" (INFERENCE_PRECISION_HINT and KV_CACHE_PRECISION f32)" if pkg.runtime == "openvino-genai" else ""),
        "gates": pkg.gates,
        "timing": pkg.timing,
        "how_measured": OV_HOW if pkg.runtime == "openvino-genai" else GENAI_HOW,
        "results": rows,
        "selected": best["key"] if best else None,
        "emulated": detect_emulation(),  # under qemu-user its times are the emulator's, not the board's
    }
