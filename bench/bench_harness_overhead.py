"""Harness overhead: the conformance node runner (isolated worker, provider contract, onnx's comparison)
against a bare in-process loop over the same ONNX node cases on the same provider. Prints the ratio
(goal <= 2x) and whether both loops classify every case identically. Both sides have the same set-up: one
OpenVINO Core per process (the harness's provider keeps one; the bare loop creates its own once, before timing).

    .venv/bin/python bench/bench_harness_overhead.py [--provider cpu|openvino] [--cases GLOB]...
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections import Counter

_CORE: list = []


def _bare_core():
    """One ov.Core for the bare loop, as the harness's worker keeps one (agent.providers.openvino._core)."""
    if not _CORE:
        import openvino as ov

        _CORE.append(ov.Core())
    return _CORE[0]


def bare_status(case, provider: str, tmp: str) -> str:
    """The plain way: create the runtime's session directly, run, compare with onnx's Runner."""
    from agent.conformance.direct import compare, direct_ort_status

    if provider == "cpu":
        return direct_ort_status(case)
    try:
        feeds = [v for v in case.inputs if v is not None]
        path = os.path.join(tmp, "m.onnx")
        with open(path, "wb") as f:
            f.write(case.model.SerializeToString())
        compiled = _bare_core().compile_model(path, "CPU")
        res = compiled(feeds)
        outs = [res[compiled.output(i)] for i in range(len(case.model.graph.output))]
    except Exception:  # noqa: BLE001 - the case could not run
        return "errored"
    return compare(case, outs)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--provider", default="cpu", choices=["cpu", "openvino"])
    ap.add_argument("--cases", action="append", default=[], help="case-name glob (repeatable); default: all")
    args = ap.parse_args()

    from agent.conformance.node import load_cases, run_variant

    cases = load_cases(args.cases or None)
    tmp = tempfile.mkdtemp(prefix="bench-bare-")
    bare_status(cases[0], args.provider, tmp)  # import the runtime and make its Core before timing
    t0 = time.perf_counter()
    bare = {c.name: bare_status(c, args.provider, tmp) for c in cases}
    t_bare = time.perf_counter() - t0
    t0 = time.perf_counter()
    ours = {r.case: r.status for r in run_variant(cases, args.provider, None)}
    t_harness = time.perf_counter() - t0
    diff = {k: (ours[k], bare[k]) for k in bare if ours.get(k) != bare[k]}
    print(f"cases            {len(cases)} on {args.provider}")
    print(f"bare loop        {t_bare:8.2f} s  {dict(Counter(bare.values()))}")
    print(f"harness          {t_harness:8.2f} s  {dict(Counter(ours.values()))}  (includes worker start-up)")
    print(f"overhead ratio   {t_harness / t_bare:8.2f}x  (goal <= 2x)")
    print(f"classification   {'identical' if not diff else f'{len(diff)} cases differ'}")
    for name, (a, b) in list(diff.items())[:20]:
        print(f"  {name}: harness {a}, bare {b}")


if __name__ == "__main__":
    main()
