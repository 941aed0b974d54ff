"""Issue 39: a generative package for OpenVINO GenAI made in code (the tiny decoder's weights, stateful IR and
tokenizer IR; agent.generative.tinyov) qualified through LLMPipeline by `edge-agent qualify`: rows per device and
precision, the fp32 CPU reference, and a perturbed variant refused by the fidelity gate. openvino-genai is in the
`test` extra: these tests require it."""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.generative.package import check_generative
from agent.generative.samples import write_openvino_package

TIMING = {"repeats": 2, "tpot_tokens": 16, "prompt_lengths": [16, 64]}


@pytest.fixture(scope="module")
def ov_pkg(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ovgen") / "tiny-ov"
    return write_openvino_package(root, variants=("perturbed",), timing=TIMING)


def test_llmpipeline_loads_the_package_and_generates_from_text(ov_pkg: Path) -> None:
    import openvino_genai as ovg

    assert check_generative(ov_pkg) == []
    pipe = ovg.LLMPipeline(str(ov_pkg), "CPU", INFERENCE_PRECISION_HINT="f32")
    ids = pipe.get_tokenizer().encode("Hi!")
    assert [int(t) for t in ids.input_ids.data[0]] == list(b"Hi!")  # the byte ids of tinymodel's tokenizer
    assert [int(t) for t in ids.attention_mask.data[0]] == [1, 1, 1]
    assert pipe.get_generation_config().eos_token_id == 256
    res = pipe.generate(ids.input_ids, max_new_tokens=12, do_sample=False, ignore_eos=True)
    assert len(res.tokens[0]) == 12
    assert isinstance(pipe.generate("Hi!", max_new_tokens=4, do_sample=False), str)


def test_the_ir_holds_the_onnx_decoders_weights(ov_pkg: Path) -> None:
    """The same weights as the onnxruntime-genai package's decoder: its logits are ONNX Runtime's on the same
    sequence (plain onnxruntime on the ONNX graph, empty past) to float32 rounding."""
    import onnxruntime as ort
    import openvino as ov

    from agent.generative.tinygraph import decoder
    from agent.generative.tinymodel import Tiny

    seq = list(b"Edge devices measure.")
    n = len(seq)
    sess = ort.InferenceSession(decoder(Tiny()).SerializeToString(), providers=["CPUExecutionProvider"])
    feeds = {"input_ids": np.asarray([seq], np.int64), "attention_mask": np.ones((1, n), np.int64)}
    feeds["position_ids"] = np.arange(n, dtype=np.int64)[None]
    for i in sess.get_inputs():
        if i.name.startswith("past_key_values"):
            feeds[i.name] = np.zeros((1, 2, 0, 16), np.float32)
    want = sess.run(["logits"], feeds)[0][0]
    compiled = ov.Core().compile_model(str(ov_pkg / "openvino_model.xml"), "CPU", {"INFERENCE_PRECISION_HINT": "f32"})
    req = compiled.create_infer_request()
    got = req.infer(
        {**{k: feeds[k] for k in ("input_ids", "attention_mask", "position_ids")}, "beam_idx": np.zeros(1, np.int32)}
    )
    assert float(np.abs(np.asarray(got["logits"])[0] - want).max()) < 1e-4
    states = req.query_state()  # the KV cache lives in the model's state (ReadValue/Assign), 2 layers x key/value
    assert len(states) == 4 and all(tuple(s.state.shape) == (1, 2, n, 16) for s in states)


def test_qualify_measures_openvino_genai_per_device_and_refuses_the_perturbed_variant(
    ov_pkg: Path, tmp_path: Path
) -> None:
    save = tmp_path / "decision.json"
    res = CliRunner().invoke(cli, ["qualify", str(ov_pkg), "--json", "--save", str(save)])
    assert res.exit_code == 0, res.output
    doc = json.loads(save.read_text())
    assert doc["model"]["runtime"] == "openvino-genai" and "LLMPipeline" in doc["how_measured"]["load_s"]
    rows = {r["key"]: r for r in doc["results"]}
    ref = rows["openvino-genai/CPU:fp32"]
    assert ref["status"] == "passed", ref
    assert ref["fidelity"]["top1"] == 1.0 and ref["fidelity"]["max_logit_diff"] == 0.0
    assert "LLMPipeline returns no logits" in ref["fidelity"]["measure"]
    assert ref["fidelity"]["pipeline_top1"] == 1.0  # LLMPipeline's own next token after each prefix
    assert ref["fidelity"]["greedy"]["match"] == 1.0 and ref["fidelity"]["greedy"]["tokens"] == 3 * 64
    assert ref["compiled_with"] == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    for row in (ref, rows["openvino-genai/CPU:device-default"], rows["openvino-genai/CPU:perturbed"]):
        assert row["load_s"] > 0 and row["peak_rss_bytes"] > 0 and row["kv_tokens_at_peak"] == 256
        assert set(row["ttft_ms"]) == {"16", "64"}
        assert all(0 < t["p50_ms"] <= t["p90_ms"] for t in row["ttft_ms"].values())
        assert row["tpot_ms"]["n"] == 2 * 2 * 15 and 0 < row["tpot_ms"]["p50_ms"] <= row["tpot_ms"]["p90_ms"]
    own = rows["openvino-genai/CPU:device-default"]  # the device's own hints (bf16 and a u8 KV cache on AVX512-BF16)
    assert own["status"] in ("passed", "failed") and set(own["compiled_with"]) == set(ref["compiled_with"])
    assert 0 < own["fidelity"]["top1"] <= 1.0
    bad = rows["openvino-genai/CPU:perturbed"]
    assert bad["status"] == "failed" and "under the floor" in bad["reason"]
    assert bad["fidelity"]["top1"] < doc["gates"]["min_top1"] and bad["fidelity"]["max_logit_diff"] > 1.0
    assert bad["fidelity"]["pipeline_top1"] < doc["gates"]["min_top1"] and "LLMPipeline's next-token" in bad["reason"]
    for dev in ("GPU", "NPU"):
        row = rows[f"openvino-genai/{dev}:fp32"]
        assert row["status"] != "error", row
        if row["status"] == "unavailable":
            assert row["reason"] and row["fix"], row
    other = rows["onnxruntime-genai/-"]
    assert other["status"] == "unavailable" and "openvino-genai" in other["reason"]
    assert doc["selected"] in {k for k, r in rows.items() if r["status"] == "passed"}
    human = CliRunner().invoke(cli, ["qualify", str(ov_pkg), "--provider", "cpu"])
    assert re.search(r"openvino-genai/CPU:perturbed +failed", human.output), human.output
    assert "selected: openvino-genai/CPU:" in human.output


def test_package_check_names_a_missing_ir_file(ov_pkg: Path, tmp_path: Path) -> None:
    import shutil

    broken = tmp_path / "broken"
    shutil.copytree(ov_pkg, broken)
    (broken / "perturbed" / "openvino_tokenizer.bin").unlink()
    found = check_generative(broken)
    assert [(Path(w).name, p) for w, p, _ in found] == [("openvino_tokenizer.xml", "missing")]
    assert "perturbed" in found[0][0]


def test_serving_loads_the_row_qualification_names(ov_pkg: Path) -> None:
    """serving.generative's variant picks the directory and the hints: the package's own model at f32 (the fp32
    row), `device-default` the same model with the device's own hints, a variant its own folder at f32."""
    from agent.serving.generative.host import GenerativeHost
    from agent.serving.generative.install import model_dir

    where, spec = model_dir(ov_pkg, "device-default")
    assert where == ov_pkg and (spec.runtime, spec.precision, spec.max_length) == (
        "openvino-genai",
        "device-default",
        256,
    )
    model = GenerativeHost().load("lm", "1", where, "cpu", spec)
    assert model.runtime == "openvino-genai" and model.device == "CPU" and model.hints == {}
    where, spec = model_dir(ov_pkg, "perturbed")
    assert where == ov_pkg / "perturbed" and spec.precision == "perturbed"
    model = GenerativeHost().load("lm", "1", where, "CPU", spec)
    assert model.hints == {"INFERENCE_PRECISION_HINT": "f32", "KV_CACHE_PRECISION": "f32"}
    assert model.kv.max_length == 256  # a variant's folder has no model.yaml: the package's, one up


def test_package_writes_an_openvino_genai_package_from_an_export_directory(tmp_path: Path) -> None:
    """`edge-agent package --generative DIR` on OpenVINO GenAI's layout (what optimum-cli export openvino leaves:
    the IRs, no model.yaml): runtime openvino-genai, max_length from config.json or --max-length."""
    from agent.generative.package import load_generative
    from agent.generative.tinyov import write_tiny_openvino

    built = write_tiny_openvino(tmp_path / "export", max_length=128)
    out = tmp_path / "pkg"
    args = ["package", "--generative", str(built), "--prompt", "Once upon a time", "--out", str(out)]
    res = CliRunner().invoke(cli, args)  # the IRs declare no max_length: it must be given
    assert res.exit_code != 0 and "give --max-length" in str(res.exception or res.output), res.output
    assert not out.exists()
    res = CliRunner().invoke(cli, [*args, "--max-length", "128"])
    assert res.exit_code == 0, res.output
    pkg = load_generative(out)
    assert (pkg.runtime, pkg.max_length, pkg.prompts) == ("openvino-genai", 128, ["Once upon a time"])
    assert check_generative(out) == []
    assert "ok (edge-agent qualify measures it" in CliRunner().invoke(cli, ["package", "--check", str(out)]).output
    (built / "config.json").write_text(json.dumps({"max_position_embeddings": 96}))  # as optimum-cli writes it
    again = tmp_path / "pkg2"
    assert CliRunner().invoke(cli, [*args[:-1], str(again)]).exit_code == 0
    assert load_generative(again).max_length == 96
    res = CliRunner().invoke(cli, [*args[:-1], str(tmp_path / "pkg3"), "--max-length", "200"])
    assert res.exit_code != 0 and "exceeds the 96 tokens" in str(res.exception or res.output), res.output
    (built / "openvino_detokenizer.xml").unlink()
    res = CliRunner().invoke(cli, [*args[:-1], str(tmp_path / "pkg4"), "--max-length", "64"])
    assert res.exit_code != 0 and "openvino_detokenizer.xml" in str(res.exception or res.output), res.output
