"""Generative packages: a model in its runtime's own layout plus a model.yaml with `kind: generative`.

    DIR/model.yaml            name, version, kind: generative, runtime (onnxruntime-genai, openvino-genai), max_length,
                              prompts (the texts it is judged on), optional variants {name: subdir} (each a
                              complete model in the same layout, e.g. int8/), optional gates and timing
    DIR/genai_config.json     onnxruntime-genai's config; DIR/model.onnx (or the file it names); the tokenizer files
    or (openvino-genai) DIR/openvino_model.xml, openvino_tokenizer.xml, openvino_detokenizer.xml, each with its .bin
The root model is the fp32 reference every variant is judged against. Nothing here imports a runtime.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from agent.errors import ModelError

RUNTIMES = ("onnxruntime-genai", "openvino-genai")
OV_FILES = ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml")  # LLMPipeline's layout
KEYS = {"name", "version", "kind", "runtime", "max_length", "prompts", "variants", "gates", "timing", "description"}
GATE_KEYS = {"min_top1", "max_logit_diff", "max_tpot_ms", "max_rss_mb"}
TIMING_KEYS = {"prompt_lengths", "tpot_tokens", "repeats", "greedy_tokens"}
DEFAULT_GATES = {"min_top1": 0.98, "max_logit_diff": 1.0, "max_tpot_ms": None, "max_rss_mb": None}
DEFAULT_TIMING = {"prompt_lengths": [32, 128], "tpot_tokens": 64, "repeats": 5, "greedy_tokens": 64}
TOKENIZER_FILES = ("tokenizer.json", "tokenizer.model", "vocab.json")


@dataclass
class GenerativePackage:
    root: Path
    name: str
    version: str
    runtime: str
    max_length: int
    prompts: list[str]
    variants: dict[str, Path] = field(default_factory=dict)
    gates: dict[str, Any] = field(default_factory=dict)
    declared_gates: dict[str, Any] = field(default_factory=dict)  # model.yaml's own (gates = defaults + these)
    timing: dict[str, Any] = field(default_factory=dict)


def _meta(root: Path) -> dict[str, Any]:
    from agent.util.yamlsafe import load_file

    meta = load_file(root / "model.yaml", "model.yaml", ModelError, max_bytes=1 << 20) or {}
    if not isinstance(meta, dict):
        raise ModelError(f"{root / 'model.yaml'}: expected a mapping")
    return meta


def is_generative(path: str | Path) -> bool:
    """True for a directory whose model.yaml says `kind: generative` (an unreadable one is not generative here)."""
    root = Path(path)
    if not (root / "model.yaml").is_file():
        return False
    try:
        return _meta(root).get("kind") == "generative"
    except ModelError:
        return False


def layout_problems(model_dir: Path, runtime: str, max_length: int | None) -> list[tuple[str, str, str]]:
    """(where, problem, fix) for a model directory in its runtime's layout."""
    if runtime == "openvino-genai":
        return [
            (str(model_dir / f), "missing", f"write {f} and its .bin (optimum-cli export openvino, or tinyov.py)")
            for f in OV_FILES
            if not (model_dir / f).is_file() or not (model_dir / f).with_suffix(".bin").is_file()
        ]
    cfg_path = model_dir / "genai_config.json"
    if not cfg_path.is_file():
        return [(str(cfg_path), "missing", "write the runtime's config (its model builder writes genai_config.json)")]
    try:
        cfg = json.loads(cfg_path.read_text(encoding="utf-8"))
        decoder = cfg["model"]["decoder"]
    except (ValueError, KeyError, TypeError) as exc:
        return [(str(cfg_path), f"not a genai config: {exc}", "regenerate it with the runtime's model builder")]
    found = []
    onnx_file = model_dir / str(decoder.get("filename") or "model.onnx")
    if not onnx_file.is_file():
        found.append((str(onnx_file), "the decoder named by genai_config.json is missing", "copy the model file"))
    if not any((model_dir / f).is_file() for f in TOKENIZER_FILES):
        found.append((str(model_dir), "no tokenizer file", f"add one of {', '.join(TOKENIZER_FILES)}"))
    limit = (cfg.get("model") or {}).get("context_length")
    if max_length and isinstance(limit, int) and max_length > limit:
        found.append(
            (
                "model.yaml: max_length",
                f"{max_length} exceeds the model's context_length {limit}",
                f"set max_length <= {limit}",
            )
        )
    return found


def _meta_problems(meta: dict[str, Any]) -> list[tuple[str, str, str]]:
    found = [
        (f"model.yaml: {k}", "unknown key", f"remove it (known: {', '.join(sorted(KEYS))})")
        for k in meta
        if k not in KEYS
    ]
    if meta.get("runtime") not in RUNTIMES:
        found.append(
            (
                "model.yaml: runtime",
                f"{meta.get('runtime')!r} is not a generative runtime",
                f"set runtime: one of {', '.join(RUNTIMES)}",
            )
        )
    ml = meta.get("max_length")
    if not isinstance(ml, int) or isinstance(ml, bool) or ml < 2:
        found.append(("model.yaml: max_length", f"{ml!r} is not a token count", "set max_length: the KV cache size"))
    prompts = meta.get("prompts")
    if not (isinstance(prompts, list) and prompts and all(isinstance(p, str) and p for p in prompts)):
        found.append(
            ("model.yaml: prompts", "no judge prompts", "add prompts: [text, ...] (fidelity is judged on them)")
        )
    found += _timing_problems(meta.get("timing"), ml if isinstance(ml, int) else None)
    for key, known in (("gates", GATE_KEYS), ("timing", TIMING_KEYS)):
        value = meta.get(key) or {}
        if not isinstance(value, dict):
            found.append((f"model.yaml: {key}", "expected a mapping", f"use keys {', '.join(sorted(known))}"))
            continue
        found += [
            (f"model.yaml: {key}.{k}", "unknown key", f"use {', '.join(sorted(known))}")
            for k in value
            if k not in known
        ]
    return found


def _timing_problems(raw: Any, max_length: int | None) -> list[tuple[str, str, str]]:
    """timing: positive integers, and the longest timed prompt plus tpot_tokens within max_length."""
    t = {**DEFAULT_TIMING, **(raw if isinstance(raw, dict) else {})}
    lengths = t["prompt_lengths"]
    ints = [t["tpot_tokens"], t["repeats"], t["greedy_tokens"], *(lengths if isinstance(lengths, list) else [])]
    if not isinstance(lengths, list) or not lengths or not all(isinstance(v, int) and v > 0 for v in ints):
        return [
            (
                "model.yaml: timing",
                "prompt_lengths, tpot_tokens, repeats and greedy_tokens must be positive "
                "integers (prompt_lengths a non-empty list)",
                "fix the values",
            )
        ]
    if max_length is not None and max(lengths) + t["tpot_tokens"] > max_length:
        return [
            (
                "model.yaml: timing.prompt_lengths",
                f"{max(lengths)} + tpot_tokens {t['tpot_tokens']} exceed max_length {max_length}",
                "shorten the timed prompts or tpot_tokens",
            )
        ]
    return []


def check_generative(path: str | Path) -> list[tuple[str, str, str]]:
    """Every (where, problem, fix) a generative package needs (empty: it can be qualified)."""
    root = Path(path)
    try:
        meta = _meta(root)
    except ModelError as exc:
        return [(str(root / "model.yaml"), str(exc), "fix the YAML syntax")]
    found = _meta_problems(meta)
    runtime = str(meta.get("runtime"))
    max_length = meta.get("max_length") if isinstance(meta.get("max_length"), int) else None
    if runtime in RUNTIMES:
        found += layout_problems(root, runtime, max_length)
        variants = meta.get("variants") or {}
        if not isinstance(variants, dict):
            return [*found, ("model.yaml: variants", "expected {name: subdirectory}", "map each variant to its folder")]
        for name, sub in variants.items():
            vdir = (root / str(sub)).resolve()
            if root.resolve() not in vdir.parents:
                found.append((f"model.yaml: variants.{name}", "outside the package", "use a subdirectory"))
                continue
            found += layout_problems(vdir, runtime, max_length)
    return list(dict.fromkeys(found))  # a variant repeats the root's max_length finding: say it once


def load_generative(path: str | Path) -> GenerativePackage:
    """The package, or ModelError naming every problem check_generative finds."""
    root = Path(path)
    problems = check_generative(root)
    if problems:
        raise ModelError("; ".join(f"{w}: {p} ({f})" for w, p, f in problems))
    meta = _meta(root)
    return GenerativePackage(
        root=root,
        name=str(meta.get("name") or root.name),
        version=str(meta.get("version") or "0"),
        runtime=str(meta["runtime"]),
        max_length=int(meta["max_length"]),
        prompts=list(meta["prompts"]),
        variants={str(k): root / str(v) for k, v in (meta.get("variants") or {}).items()},
        gates={**DEFAULT_GATES, **(meta.get("gates") or {})},
        declared_gates=dict(meta.get("gates") or {}),
        timing={**DEFAULT_TIMING, **(meta.get("timing") or {})},
    )


def apply_target_gates(pkg: GenerativePackage, target: Any) -> dict[str, str]:
    """Apply the target's qualify.generative gates over model.yaml's; where each gate came from."""
    from_target = target.qualify.get("generative") or {}
    pkg.gates.update(from_target)
    return {
        k: f"target {target.name}" if k in from_target else "model.yaml" if k in pkg.declared_gates else "default"
        for k in DEFAULT_GATES
    }


def write_from_builder(
    src: Path,
    out: Path,
    *,
    name: str | None,
    version: str,
    prompts: list[str],
    force: bool = False,
    max_length: int | None = None,
) -> Path:
    """A generative package from a directory its runtime's own builder wrote, the files copied to `out` and a
    model.yaml: onnxruntime-genai's layout (genai_config.json; max_length from its search.max_length or
    context_length) or OpenVINO GenAI's (openvino_model.xml with its tokenizer and detokenizer IRs, as
    `optimum-cli export openvino` writes them; max_length from its config.json max_position_embeddings or
    generation_config.json max_length). `max_length` given: that, checked against what the directory declares."""
    import shutil

    ov = not (src / "genai_config.json").is_file() and (src / OV_FILES[0]).is_file()
    runtime = "openvino-genai" if ov else "onnxruntime-genai"
    found = layout_problems(src, runtime, max_length)
    if found:
        raise ModelError("; ".join(f"{w}: {p} ({f})" for w, p, f in found))
    if out.exists() and any(out.iterdir()) and not force:
        raise ModelError(f"{out}: not empty (give --force to overwrite)")
    declared = _builder_max_length(src, runtime)
    if max_length is not None and declared is not None and max_length > declared:
        raise ModelError(f"--max-length {max_length} exceeds the {declared} tokens {src} declares")
    length = max_length or declared
    if length is None:
        where = (
            "config.json max_position_embeddings, generation_config.json max_length"
            if ov
            else "genai_config.json search.max_length, model.context_length"
        )
        raise ModelError(f"{src}: no max_length is declared (neither {where}): give --max-length N")
    shutil.copytree(src, out, dirs_exist_ok=True)
    lines = [
        f"name: {json.dumps(name or src.resolve().name)}",
        f"version: {json.dumps(version)}",
        "kind: generative",
        f"runtime: {runtime}",
        f"max_length: {length}",
        "prompts:",
    ]
    lines += [f"  - {json.dumps(p)}" for p in prompts]
    if _timing_problems(None, length):  # the default timed prompts do not fit a short context: scale them
        tpot = max(1, min(64, length // 4))
        lines.append(f"timing: {{prompt_lengths: [{max(1, length // 8)}, {max(1, length // 2)}], tpot_tokens: {tpot}}}")
    (out / "model.yaml").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def _builder_max_length(src: Path, runtime: str) -> int | None:
    """The longest sequence the builder's files declare, or None."""
    sources = (
        [("genai_config.json", ("search", "max_length")), ("genai_config.json", ("model", "context_length"))]
        if runtime == "onnxruntime-genai"
        else [("config.json", ("max_position_embeddings",)), ("generation_config.json", ("max_length",))]
    )
    for file, keys in sources:
        try:
            value: Any = json.loads((src / file).read_text(encoding="utf-8"))
            for k in keys:
                value = value.get(k) if isinstance(value, dict) else None
        except (OSError, ValueError):
            continue
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
