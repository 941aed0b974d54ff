"""Another device's report.json beside this one: its variants become columns, and the cases that differ are listed."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Protocol

from agent.errors import EdgeAgentError


class Report(Protocol):
    """What this module reads and extends of agent.conformance.report.Report (which imports this module)."""

    variants: dict[str, dict[str, Any]]
    cases: list[dict[str, Any]]
    meta: dict[str, Any]


MAX_REPORT_BYTES = 256 * 2**20  # a full node + models report is a few MB; refuse anything absurd before reading it


def label_of(doc: dict[str, Any]) -> str:
    """A short column suffix for a report: its target (else arch), plus "emulated" when it was."""
    hw = doc.get("hardware") or {}
    base = str(doc.get("target") or hw.get("arch") or "other")
    return f"{base}-emulated" if doc.get("emulated") else base


def load_report(path: Path) -> dict[str, Any]:
    """A report.json written by `edge-agent conformance`; clear errors for anything else."""
    try:
        size = path.stat().st_size
    except OSError as exc:
        raise EdgeAgentError(f"{path}: cannot read the report: {exc.strerror or exc}") from exc
    if size > MAX_REPORT_BYTES:
        raise EdgeAgentError(f"{path}: {size} bytes is larger than a conformance report can be ({MAX_REPORT_BYTES})")
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise EdgeAgentError(f"{path}: not a conformance report.json: {exc}") from exc
    if not isinstance(doc, dict) or not isinstance(doc.get("cases"), list) or not isinstance(doc.get("variants"), dict):
        raise EdgeAgentError(f"{path}: not a conformance report.json (no 'cases' list and 'variants' mapping)")
    for i, c in enumerate(doc["cases"]):
        if not isinstance(c, dict) or not {"suite", "case", "provider", "status"} <= set(c):
            raise EdgeAgentError(f"{path}: cases[{i}] lacks suite/case/provider/status")
    return doc


def include(report: Report, doc: dict[str, Any], source: str = "") -> str:
    """Add the other report's node cases as variants `<key>@<label>`; returns the label."""
    label = label_of(doc)
    taken = {k.rsplit("@", 1)[-1] for k in report.variants if "@" in k}
    n, unique = 2, label
    while unique in taken:
        unique, n = f"{label}-{n}", n + 1
    hw = doc.get("hardware") or {}
    for key, info in doc["variants"].items():
        report.variants[f"{key}@{unique}"] = {
            **{k: info.get(k) for k in ("provider", "precision", "requested_precision", "available", "reason")},
            "base": key,
            "from": unique,
            "arch": hw.get("arch"),
            "emulated": doc.get("emulated"),
        }
    for c in doc["cases"]:
        if c["suite"] == "onnx-node":
            report.cases.append({**c, "provider": f"{c['provider']}@{unique}"})
    report.meta.setdefault("included", []).append(
        {
            "label": unique,
            "source": source,
            "target": doc.get("target"),
            "hardware": hw,
            "versions": doc.get("versions"),
            "emulated": doc.get("emulated"),
            "created_iso": doc.get("created_iso"),
        }
    )
    return unique


def differences(report: Report, limit: int = 400) -> dict[str, dict[str, Any]]:
    """For each included variant whose base key also ran here: node cases whose status differs."""
    out: dict[str, dict[str, Any]] = {}
    by: dict[str, dict[str, dict[str, Any]]] = {}
    for c in report.cases:
        if c["suite"] == "onnx-node":
            by.setdefault(c["provider"], {})[c["case"]] = c
    for key, info in report.variants.items():
        base = info.get("base")
        if not info.get("from") or base not in by or key not in by:
            continue
        here, there = by[base], by[key]
        common = sorted(set(here) & set(there))
        diff = [n for n in common if here[n]["status"] != there[n]["status"]]
        flips: dict[str, int] = {}
        for n in diff:
            flips[f"{here[n]['status']} -> {there[n]['status']}"] = (
                flips.get(f"{here[n]['status']} -> {there[n]['status']}", 0) + 1
            )
        out[key] = {
            "here": base,
            "there": key,
            "label": info["from"],
            "emulated": info.get("emulated"),
            "cases": len(common),
            "same": len(common) - len(diff),
            "differ": len(diff),
            "flips": dict(sorted(flips.items(), key=lambda kv: -kv[1])),
            "examples": [
                {
                    "case": n,
                    "op": here[n].get("op"),
                    "here": here[n]["status"],
                    "there": there[n]["status"],
                    "reason_here": (here[n].get("reason") or "")[:200],
                    "reason_there": (there[n].get("reason") or "")[:200],
                }
                for n in diff[:limit]
            ],
        }
    return out
