"""The conformance report: counts per provider, every case, bf16-vs-f32 differences; JSON and JUnit writers."""

from __future__ import annotations

import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.util.atomic import atomic_write_bytes, atomic_write_json

STATUSES = ("passed", "failed", "errored", "skipped")


@dataclass
class Report:
    suite: str
    cases: list[dict[str, Any]] = field(default_factory=list)
    models: list[dict[str, Any]] = field(default_factory=list)
    variants: dict[str, dict[str, Any]] = field(default_factory=dict)  # key -> provider, precision, available, reason
    meta: dict[str, Any] = field(default_factory=dict)

    def counts(self, suite: str | None = None) -> dict[str, dict[str, int]]:
        """The pinned block: provider key -> {passed, failed, errored, skipped, total}."""
        by: dict[str, Counter] = defaultdict(Counter)
        for key in self.variants:
            by[key]  # every requested variant appears, even with no cases
        for c in self.cases:
            if suite is None or c["suite"] == suite:
                by[c["provider"]][c["status"]] += 1
        return {k: {**{s: v[s] for s in STATUSES}, "total": sum(v[s] for s in STATUSES)} for k, v in by.items()}

    def precision_differences(self) -> dict[str, dict[str, Any]]:
        """For each provider measured at two precisions: node cases that flip between them."""
        out = {}
        for key, info in self.variants.items():
            base = info["provider"]
            if key == base or base not in self.variants or info.get("from"):
                continue
            a = {c["case"]: c["status"] for c in self.cases if c["provider"] == base and c["suite"] == "onnx-node"}
            b = {c["case"]: c["status"] for c in self.cases if c["provider"] == key and c["suite"] == "onnx-node"}
            common = sorted(set(a) & set(b))
            if not common:  # e.g. a models-only run: no node cases to compare
                continue
            worse = [n for n in common if b[n] == "passed" and a[n] != "passed"]
            better = [n for n in common if a[n] == "passed" and b[n] != "passed"]
            out[base] = {
                "default": base,
                "default_precision": self.variants[base].get("precision"),
                "variant": key,
                "variant_precision": info.get("precision"),
                "cases": len(common),
                "passed_default": sum(a[n] == "passed" for n in common),
                "passed_variant": sum(b[n] == "passed" for n in common),
                "fail_only_at_default": len(worse),
                "fail_only_at_variant": len(better),
                "examples_fail_only_at_default": worse[:40],
                "examples_fail_only_at_variant": better[:40],
            }
        return out

    def explanations(self) -> dict[str, dict[str, dict[str, int]]]:
        """Every provider's failed/errored/skipped count broken down by cause (agent.conformance.causes)."""
        from agent.conformance.causes import explain

        return explain(self.cases)

    def platform_differences(self) -> dict[str, dict[str, Any]]:
        """Node cases whose status differs between this host and an included report (agent.conformance.compare)."""
        from agent.conformance.compare import differences

        return differences(self)

    def to_dict(self) -> dict[str, Any]:
        suites = sorted({c["suite"] for c in self.cases})
        return {
            **self.meta,
            "suite": self.suite,
            "providers": self.counts(),
            "suites": {s: self.counts(s) for s in suites},
            "variants": self.variants,
            "precision_differences": self.precision_differences(),
            "platform_differences": self.platform_differences(),
            "explanations": self.explanations(),
            "models": self.models,
            "cases": self.cases,
        }


_DERIVED = ("suite", "providers", "suites", "variants", "precision_differences", "platform_differences", "explanations")


def from_dict(doc: dict[str, Any]) -> Report:
    """A Report again from its report.json (agent.conformance.compare.load_report checks the shape)."""
    meta = {k: v for k, v in doc.items() if k not in (*_DERIVED, "cases", "models")}
    return Report(
        suite=str(doc.get("suite") or "all"),
        cases=list(doc["cases"]),
        models=list(doc.get("models") or []),
        variants=dict(doc["variants"]),
        meta=meta,
    )


def write_json(report: Report, path: Path) -> None:
    atomic_write_json(path, report.to_dict())


def junit_xml(report: Report) -> bytes:
    """One <testsuite> per (suite, provider); failed -> <failure>, errored -> <error>, skipped -> <skipped>."""
    root = ET.Element("testsuites", name=f"edge-agent conformance ({report.suite})")
    groups: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for c in report.cases:
        groups[(c["suite"], c["provider"])].append(c)
    for (suite, provider), cases in sorted(groups.items()):
        counts = Counter(c["status"] for c in cases)
        ts = ET.SubElement(
            root,
            "testsuite",
            name=f"{suite}.{provider}",
            tests=str(len(cases)),
            failures=str(counts["failed"]),
            errors=str(counts["errored"]),
            skipped=str(counts["skipped"]),
            time=f"{sum(c.get('time_s') or 0 for c in cases):.3f}",
        )
        for c in cases:
            tc = ET.SubElement(
                ts, "testcase", classname=f"{suite}.{provider}", name=c["case"], time=f"{c.get('time_s') or 0:.4f}"
            )
            tag = {"failed": "failure", "errored": "error", "skipped": "skipped"}.get(c["status"])
            if tag:
                ET.SubElement(tc, tag, message=_clean(c.get("reason") or c["status"]))
    ET.indent(root)
    return b'<?xml version="1.0" encoding="utf-8"?>\n' + ET.tostring(root, encoding="utf-8") + b"\n"


def _clean(text: str) -> str:
    """XML 1.0 cannot carry most control characters (ORT's coloured logs contain ESC)."""
    return "".join(ch for ch in text if ch in "\t\n\r" or ord(ch) >= 0x20)[:2000]


def write_junit(report: Report, path: Path) -> None:
    atomic_write_bytes(path, junit_xml(report))


def write_all(report: Report, out_dir: Path) -> dict[str, Path]:
    """report.json, junit.xml and report.html under out_dir."""
    from agent.conformance.html import render_html

    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "report.json", "junit": out_dir / "junit.xml", "html": out_dir / "report.html"}
    write_json(report, paths["json"])
    write_junit(report, paths["junit"])
    atomic_write_bytes(paths["html"], render_html(report.to_dict()).encode())
    return paths
