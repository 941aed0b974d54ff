"""Real third-party models shipped inside pip wheels (tests/requirements-models.txt, installed with
--no-deps: only the .onnx files are read, the packages are never imported): rapidocr-onnxruntime's PP-OCRv4
text detector and recognizer and its text-direction classifier, and silero-vad's voice-activity models
(an If on the sample rate, a scalar int64 `sr` input, a recurrent state input; an fp16 build). Each package
declares its shapes in model.yaml as a user would, and its golden data are inputs shaped like real ones
(an image with lines of text-like strokes, a voiced audio chunk) with the outputs of plain onnxruntime CPU."""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

import numpy as np
from realmodels import write_meta, write_sets


def shipped_file(module: str, rel: str) -> Path:
    """A file inside an installed package, found without importing it (its dependencies are not installed)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(f"{module} is not installed (pip install --no-deps -r tests/requirements-models.txt)")
    path = Path(next(iter(spec.submodule_search_locations))) / rel
    if not path.is_file():
        raise FileNotFoundError(f"{module} does not ship {rel}")
    return path


def _text_image(h: int, w: int, seed: int, lines: int) -> np.ndarray:
    """A grey page (uint8, HxWx3) with `lines` rows of dark, word-like clusters of vertical/horizontal strokes."""
    rng = np.random.default_rng(seed)
    img = np.full((h, w, 3), 235, np.float32) + rng.normal(0, 4, (h, w, 3))
    line_h = max(8, h // (lines + 1))
    for li in range(lines):
        top = (li + 1) * h // (lines + 1) - line_h // 2
        x = int(rng.integers(2, max(3, w // 10)))
        while x < w - 8:
            word = int(rng.integers(3, 9))
            for _ in range(word):
                cw = int(rng.integers(max(3, line_h // 3), max(4, line_h // 2 + 2)))
                if x + cw >= w - 2:
                    break
                sw = max(1, line_h // 8)
                glyph = rng.integers(0, 4)
                t, b = top + line_h // 6, top + line_h - line_h // 6
                img[t:b, x : x + sw] = 30  # left stem
                if glyph in (1, 3):
                    img[t:b, x + cw - sw : x + cw] = 30
                if glyph in (0, 3):
                    img[t : t + sw, x : x + cw] = 30
                if glyph in (1, 2):
                    img[(t + b) // 2 : (t + b) // 2 + sw, x : x + cw] = 30
                x += cw + max(1, cw // 3)
            x += int(rng.integers(line_h // 2, line_h + 2))
    return np.clip(img, 0, 255).astype(np.uint8)


def _det_input(img: np.ndarray) -> np.ndarray:
    """PP-OCR det preprocessing: /255, ImageNet mean/std, HWC -> NCHW."""
    mean, std = np.array([0.485, 0.456, 0.406], np.float32), np.array([0.229, 0.224, 0.225], np.float32)
    x = (img.astype(np.float32) / 255.0 - mean) / std
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _rec_input(img: np.ndarray) -> np.ndarray:
    """PP-OCR rec/cls preprocessing: /255, (x - 0.5) / 0.5, HWC -> NCHW."""
    x = (img.astype(np.float32) / 255.0 - 0.5) / 0.5
    return np.ascontiguousarray(x.transpose(2, 0, 1)[None])


def _copy(module: str, rel: str, root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(shipped_file(module, rel), root / "model.onnx")
    return root / "model.onnx"


def ocr_det_package(root: Path, *, opt: int = 320, big: int = 640) -> Path:
    """PP-OCRv4 text detector (x: [N, 3, H, W], H and W dynamic, multiples of 32) -> a probability map."""
    model = _copy("rapidocr_onnxruntime", "models/ch_PP-OCRv4_det_infer.onnx", root)
    write_sets(root, model, [{"x": _det_input(_text_image(opt, opt, seed=s, lines=6))} for s in (1, 2)])
    write_meta(
        root,
        name="ocr-det",
        version="4",
        task="text detection",
        input_shapes={"x": {"min": [1, 3, 32, 32], "opt": [1, 3, opt, opt], "max": [1, 3, big, big]}},
    )
    return root


def ocr_rec_package(root: Path, *, opt: int = 320, big: int = 640) -> Path:
    """PP-OCRv4 text recognizer (x: [N, 3, 48, W], W dynamic) -> [N, W/8, 6625] character probabilities."""
    model = _copy("rapidocr_onnxruntime", "models/ch_PP-OCRv4_rec_infer.onnx", root)
    write_sets(root, model, [{"x": _rec_input(_text_image(48, opt, seed=s, lines=1))} for s in (3, 4)])
    write_meta(
        root,
        name="ocr-rec",
        version="4",
        task="text recognition",
        input_shapes={"x": {"min": [1, 3, 48, 32], "opt": [1, 3, 48, opt], "max": [1, 3, 48, big]}},
    )
    return root


def ocr_cls_package(root: Path) -> Path:
    """PP-OCR mobile v2 text-direction classifier (x: [N, 3, 48, 192]) -> [N, 2] (0 or 180 degrees)."""
    model = _copy("rapidocr_onnxruntime", "models/ch_ppocr_mobile_v2.0_cls_infer.onnx", root)
    sets = []
    for s in (5, 6, 7, 8):
        img = _text_image(48, 192, seed=s, lines=1)
        sets.append({"x": _rec_input(img if s % 2 else img[::-1, ::-1].copy())})  # upright and upside-down
    write_sets(root, model, sets)
    write_meta(
        root,
        name="ocr-cls",
        version="2",
        task="classification",
        input_shapes={"x": {"min": [1, 3, 48, 192], "opt": [1, 3, 48, 192], "max": [6, 3, 48, 192]}},
    )
    return root


def _voice(seed: int, n: int = 576, sr: int = 16000) -> np.ndarray:
    """A voiced chunk: a 140 Hz glottal-like harmonic series with formant-ish weights, plus noise."""
    rng = np.random.default_rng(seed)
    t = np.arange(n) / sr
    f0 = 110.0 + 30.0 * seed
    wave = sum((1.0 / k) * np.sin(2 * np.pi * f0 * k * t + rng.uniform(0, 6.28)) for k in range(1, 16))
    return (0.3 * wave / np.abs(wave).max() + 0.01 * rng.standard_normal(n)).astype(np.float32)[None]


def _vad_sets(with_sr: bool) -> list[dict[str, np.ndarray]]:
    sets = []
    for chunk in (_voice(1), 0.005 * np.random.default_rng(2).standard_normal((1, 576))):  # speech, silence
        feeds = {"input": chunk.astype(np.float32), "state": np.zeros((2, 1, 128), np.float32)}
        if with_sr:
            feeds["sr"] = np.array(16000, np.int64)
        sets.append(feeds)
    return sets


def silero_vad_package(root: Path, *, rel: str = "data/silero_vad.onnx", name: str = "silero-vad") -> Path:
    """silero-vad (input [N, 64 context + 512 samples] at 16 kHz, state [2, N, 128], sr scalar int64 ->
    speech probability [N, 1] and the next state). The graph branches on sr (If)."""
    model = _copy("silero_vad", rel, root)
    import onnx

    with_sr = any(i.name == "sr" for i in onnx.load(str(model), load_external_data=False).graph.input)
    write_sets(root, model, _vad_sets(with_sr))
    meta: dict = {
        "name": name,
        "version": "6.2.3",
        "task": "voice activity detection",
        "input_shapes": {"input": [1, 576], "state": [2, 1, 128]},
        "input_values": {"state": 0.0, **({"sr": 16000} if with_sr else {})},
    }
    write_meta(root, **meta)
    return root


def silero_vad_half_package(root: Path) -> Path:
    """silero-vad's fp16 build (float32 inputs and outputs, float16 inside; no sr input)."""
    return silero_vad_package(root, rel="data/silero_vad_half.onnx", name="silero-vad-half")


def ten_makers(sample_files: list[Path]) -> dict:
    """Ten real-model packages (name -> writer(dir)): the pip-shipped OCR and VAD models, magika, skl2onnx
    with and without ZipMap, onnxruntime's logreg_iris, an int8 QDQ classifier with its fp32 original."""
    import realmodels as rm

    return {
        "ocr-det": ocr_det_package,
        "ocr-rec": ocr_rec_package,
        "ocr-cls": ocr_cls_package,
        "silero-vad": silero_vad_package,
        "silero-vad-half": silero_vad_half_package,
        "magika": lambda d: rm.magika_package(d, sample_files),
        "skl-logreg": lambda d: rm.sklearn_package(d, zipmap=False),
        "qdq-int8": lambda d: rm.qdq_with_original(d),
        "skl-zipmap": lambda d: rm.sklearn_package(d, zipmap=True),
        "ort-logreg-iris": rm.ort_logreg_iris_package,
    }


def _ms(lat) -> str:
    return f"{lat['p50']:.3g}" if isinstance(lat, dict) and lat.get("p50") is not None else "-"


def verdict_rows(state_dir: Path) -> list[dict]:
    """real model x provider x verdict from a daemon's state directory: one row per qualification row of each
    deployment's decision record, or one row for a deployment refused before any provider ran."""
    import json

    out = []
    for f in sorted((state_dir / "deployments").glob("*.json")):
        dep = json.loads(f.read_text())
        decision = state_dir / "decisions" / f"{dep['id']}.json"
        base = {"model": dep["model"], "result": dep.get("result") or dep.get("state")}
        if not decision.exists():
            out.append({**base, "provider": "(all)", "status": "refused", "reason": dep.get("reason")})
            continue
        doc = json.loads(decision.read_text())
        for r in doc["results"]:
            out.append(
                {
                    **base,
                    "provider": r["key"],
                    "selected": r["key"] == doc.get("selected_key"),
                    "status": r["status"],
                    "precision": r.get("precision"),
                    "p50_ms": _ms(r.get("latency_ms")),
                    "p50_max_ms": _ms(r.get("latency_max_ms")),
                    "contended": r.get("contended"),
                    "reason": r.get("reason"),
                }
            )
    return out


def render_table(rows: list[dict], width: int = 110) -> str:
    """The rows as a Markdown table (the selected provider's status is starred)."""
    lines = [
        "| model | result | provider | verdict | precision | p50 ms (opt) | p50 ms (max) | reason |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        reason = (r.get("reason") or "").replace("|", "/").replace("\n", " ")
        reason = reason if len(reason) <= width else reason[: width - 3] + "..."
        verdict = r["status"] + (" *" if r.get("selected") else "") + (" (contended)" if r.get("contended") else "")
        lines.append(
            f"| {r['model']} | {r['result']} | {r['provider']} | {verdict} | {r.get('precision') or '-'} "
            f"| {r.get('p50_ms', '-')} | {r.get('p50_max_ms', '-')} | {reason} |"
        )
    return "\n".join(lines)
