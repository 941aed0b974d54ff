"""Generative packages (docs/generative.md): the tiny decoder made in code runs on onnxruntime-genai itself,
`package --check` finds what a package lacks, and `qualify` prints a row per provider and precision, selects one
and refuses a variant under the fidelity floor. Needs onnxruntime-genai (`edge-agent[genai]`, x86_64)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
from click.testing import CliRunner

from agent.cli import cli
from agent.generative import fidelity
from agent.generative.package import check_generative, load_generative
from agent.generative.samples import write_generative_package

og = pytest.importorskip("onnxruntime_genai", reason="onnxruntime-genai is not installed (edge-agent[genai])")


@pytest.fixture(scope="module")
def pkg_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_generative_package(tmp_path_factory.mktemp("gen") / "tiny", variants=("int8", "perturbed", "gqa"))


def test_the_runtime_generates_with_the_tiny_model(pkg_dir: Path) -> None:
    import numpy as np
    import onnxruntime as ort

    model = og.Model(str(pkg_dir))
    tok = og.Tokenizer(model)
    ids = [int(t) for t in tok.encode("Hello, edge!")]
    assert tok.decode(ids) == "Hello, edge!"
    params = og.GeneratorParams(model)
    params.set_search_options(max_length=48, do_sample=False)
    gen = og.Generator(model, params)
    gen.append_tokens(ids)
    teacher = np.asarray(gen.get_output("logits"))[0]
    out = []
    while not gen.is_done():
        gen.generate_next_token()
        out.append(int(gen.get_next_tokens()[0]))
    assert len(out) == 48 - len(ids)
    # the same graph run by ONNX Runtime directly, no KV cache: the same logits and the same first token
    sess = ort.InferenceSession(str(pkg_dir / "model.onnx"), providers=["CPUExecutionProvider"])
    feeds = {
        "input_ids": np.array([ids]),
        "attention_mask": np.ones((1, len(ids)), np.int64),
        "position_ids": np.arange(len(ids))[None],
    }
    for i in range(2):
        for kind in ("key", "value"):
            feeds[f"past_key_values.{i}.{kind}"] = np.zeros((1, 2, 0, 16), np.float32)
    direct = sess.run(["logits"], feeds)[0][0]
    assert np.abs(direct - teacher).max() < 1e-4
    assert int(direct[-1].argmax()) == out[0]


def test_package_check_names_every_fix(pkg_dir: Path, tmp_path: Path) -> None:
    assert check_generative(pkg_dir) == []
    bad = tmp_path / "bad"
    shutil.copytree(pkg_dir, bad)
    (bad / "int8" / "tokenizer.json").unlink()
    text = (bad / "model.yaml").read_text().replace("max_length: 256", "max_length: 999\nbogus: 1")
    (bad / "model.yaml").write_text(text)
    res = CliRunner().invoke(cli, ["package", "--check", str(bad), "--json"])
    assert res.exit_code == 1
    wheres = [f["where"] for f in json.loads(res.output)["fixes"]]
    assert wheres == ["model.yaml: bogus", "model.yaml: max_length", str(bad / "int8")]


def test_greedy_reports_the_first_divergence() -> None:
    got = fidelity.greedy([[1, 2, 3, 4], [5, 6]], [[1, 2, 9, 4], [5, 6]], 64)
    assert got == {"match": 5 / 6, "tokens": 6, "first_divergence": 2}
    assert fidelity.greedy([[1, 2]], [[1, 2]], 64)["first_divergence"] is None


def test_qualify_rows_select_and_refuse_the_perturbed_variant(pkg_dir: Path, tmp_path: Path) -> None:
    pkg = load_generative(pkg_dir)
    assert set(pkg.variants) == {"int8", "perturbed", "gqa"}
    (pkg_dir / "model.yaml").write_text(
        (pkg_dir / "model.yaml").read_text() + "timing: {repeats: 2, tpot_tokens: 16, prompt_lengths: [16, 64]}\n"
    )
    save = tmp_path / "decision.json"
    res = CliRunner().invoke(cli, ["qualify", str(pkg_dir), "--provider", "cpu", "--json", "--save", str(save)])
    assert res.exit_code == 0, res.output
    doc = json.loads(save.read_text())
    rows = {r["key"]: r for r in doc["results"]}
    ref = rows["onnxruntime-genai/cpu:fp32"]
    assert ref["status"] == "passed"
    assert ref["fidelity"]["top1"] == 1.0 and ref["fidelity"]["max_logit_diff"] == 0.0
    assert set(ref["ttft_ms"]) == {"16", "64"} and ref["tpot_ms"]["n"] == 2 * 2 * 15
    assert ref["peak_rss_bytes"] > 0 and ref["kv_tokens_at_peak"] == 256
    gqa = rows["onnxruntime-genai/cpu:gqa"]  # the same weights, attention in one fused op on a shared KV buffer
    assert gqa["status"] == "passed" and gqa["fidelity"]["top1"] == 1.0 and gqa["fidelity"]["max_logit_diff"] < 1e-3
    bad = rows["onnxruntime-genai/cpu:perturbed"]
    assert bad["status"] == "failed" and "under the floor" in bad["reason"]
    assert bad["fidelity"]["top1"] < doc["gates"]["min_top1"]
    assert doc["selected"] in {k for k, r in rows.items() if r["status"] == "passed"}
    assert rows["openvino-genai/-"]["status"] == "unavailable" and rows["openvino-genai/-"]["fix"]
    human = CliRunner().invoke(cli, ["qualify", str(pkg_dir), "--provider", "cpu"])
    assert "cpu:perturbed  failed" in human.output and "selected: onnxruntime-genai/cpu:" in human.output


def test_a_host_without_the_runtime_says_why_and_how_to_fix() -> None:
    import subprocess
    import sys

    root = Path(__file__).resolve().parent.parent
    script = (
        f"import sys; sys.path.insert(0, {str(root)!r}); from agent.generative.runtimes import genai_missing; "
        "import json; print(json.dumps(genai_missing()))"
    )
    res = subprocess.run([sys.executable, "-S", "-c", script], capture_output=True, text=True, timeout=60, check=True)
    got = json.loads(res.stdout)  # -S: no site-packages, so no onnxruntime-genai
    assert got["reason"] == "onnxruntime-genai is not installed" or got["reason"].startswith(
        "no onnxruntime-genai wheel"
    )
    assert got["fix"]


def test_on_arm_the_probe_says_whether_a_wheel_fits_the_board() -> None:
    from agent.generative.runtimes import HostFacts, genai_missing

    # Raspberry Pi OS / Debian bookworm on a Pi 5: CPython 3.11, glibc 2.36: the aarch64 wheel installs
    pi5 = genai_missing(HostFacts("Linux", "aarch64", (3, 11), (2, 36)))
    assert pi5 == {"reason": "onnxruntime-genai is not installed", "fix": "pip install 'edge-agent[genai]'"}
    # JetPack 4 (Ubuntu 18.04) on a Jetson Nano: CPython 3.6, glibc 2.27: none does, and the row says why and the fix
    nano = genai_missing(HostFacts("Linux", "aarch64", (3, 6), (2, 27)))
    assert nano is not None
    assert nano["reason"] == (
        "no onnxruntime-genai wheel installs here: its Linux aarch64 wheels need CPython 3.11-3.14 and glibc >= "
        "2.28 (manylinux_2_28); this host has Python 3.6 and glibc 2.27"
    )
    assert "build onnxruntime-genai from source" in nano["fix"] and "JetPack 6" in nano["fix"]
    musl = genai_missing(HostFacts("Linux", "aarch64", (3, 12), None))
    assert musl is not None and musl["reason"].endswith("this host has no glibc")


def test_package_writes_a_generative_package_from_a_builder_directory(tmp_path: Path) -> None:
    from agent.generative.tinymodel import write_tiny_genai

    built = write_tiny_genai(tmp_path / "builder-out", max_length=128)  # what a model builder leaves: no model.yaml
    out = tmp_path / "pkg"
    args = ["package", "--generative", str(built), "--prompt", "Once upon a time", "--out", str(out)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 0, res.output
    pkg = load_generative(out)
    assert (pkg.max_length, pkg.prompts, pkg.name) == (128, ["Once upon a time"], "builder-out")
    assert pkg.timing["prompt_lengths"] == [16, 64] and pkg.timing["tpot_tokens"] == 32  # scaled to fit 128
    assert "ok (edge-agent qualify measures it" in CliRunner().invoke(cli, ["package", "--check", str(out)]).output
    assert CliRunner().invoke(cli, args).exit_code != 0  # not empty: --force to overwrite
    (built / "tokenizer.json").unlink()
    res = CliRunner().invoke(cli, [*args[:-1], str(tmp_path / "other")])
    assert res.exit_code != 0 and "no tokenizer file" in str(res.exception or res.output)


def test_the_target_sets_the_gates(pkg_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import yaml

    from agent.errors import ConfigError
    from agent.targets import load_targets

    root = Path(__file__).resolve().parent.parent / "targets"
    tdir = tmp_path / "targets"
    shutil.copytree(root, tdir, ignore=shutil.ignore_patterns("README.md"))
    doc = yaml.safe_load((tdir / "generic-x86_64.yaml").read_text())
    doc.update(name="lab", match={"arch": "x86_64", "priority": -1})
    doc["qualify"] = {"generative": {"min_top1": 0.0, "max_logit_diff": 100.0}}  # a floor the perturbed one clears
    (tdir / "lab.yaml").write_text(yaml.safe_dump(doc))
    monkeypatch.setenv("EDGE_AGENT_TARGETS_DIR", str(tdir))
    save = tmp_path / "d.json"
    res = CliRunner().invoke(
        cli, ["qualify", str(pkg_dir), "--provider", "cpu", "--target", "lab", "--save", str(save)]
    )
    assert res.exit_code == 0, res.output
    out = json.loads(save.read_text())
    assert out["target"] == "lab" and out["gates"]["min_top1"] == 0.0
    assert out["gates_from"] == {
        "min_top1": "target lab",
        "max_logit_diff": "target lab",
        "max_tpot_ms": "default",
        "max_rss_mb": "default",
    }
    rows = {r["key"]: r for r in out["results"]}
    assert rows["onnxruntime-genai/cpu:perturbed"]["status"] == "passed"
    doc["qualify"] = {"generative": {"min_top1": "high"}}
    (tdir / "lab.yaml").write_text(yaml.safe_dump(doc))
    with pytest.raises(ConfigError, match=r"qualify\.generative\.min_top1"):
        load_targets(tdir)


def test_a_row_over_the_memory_limit_is_killed_and_says_so(pkg_dir: Path, tmp_path: Path) -> None:
    save = tmp_path / "d.json"
    args = ["qualify", str(pkg_dir), "--provider", "cpu", "--memory-max", "16M", "--save", str(save)]
    res = CliRunner().invoke(cli, args)
    assert res.exit_code == 3, res.output
    doc = json.loads(save.read_text())
    ref = doc["results"][0]
    assert doc["memory_max"] == 16 << 20 and ref["status"] == "failed" and ref["reason"].startswith("memory:")
    assert doc["selected"] is None


def test_a_generative_package_loads_for_fleet_push_as_a_directory_and_a_tarball(pkg_dir: Path, tmp_path: Path) -> None:
    """fleet push, rollouts and the control plane's upload check a package through check_loads: a generative one
    by its own checks (the ONNX package loader refuses model.yaml's `kind`), a broken one with the reason."""
    import tarfile

    from agent.errors import ModelError
    from agent.package.unpack import check_loads

    check_loads(pkg_dir)
    tgz = tmp_path / "lm.tar.gz"
    with tarfile.open(tgz, "w:gz") as tar:
        tar.add(pkg_dir, arcname="lm")
    check_loads(tgz)
    broken = shutil.copytree(pkg_dir, tmp_path / "broken")
    (broken / "genai_config.json").unlink()
    with pytest.raises(ModelError, match="genai_config.json"):
        check_loads(broken)


def test_live_prompts_are_copies_kept_within_their_cap() -> None:
    from agent.serving.generative.recent import LivePrompts

    ring = LivePrompts(count=3, tokens=4)
    prompt = [1, 2, 3, 4, 5, 6]
    ring.add(prompt)
    prompt.append(7)  # the caller's list changes: the kept copy does not
    for p in ([8], [], [9, 10], [11]):
        ring.add(p)
    assert ring.recent() == [[8], [9, 10], [11]] and ring.seen == 4  # the oldest went first; an empty one is not kept
    ring = LivePrompts(count=3, tokens=4)
    ring.add(prompt)
    assert ring.recent() == [[4, 5, 6, 7]]  # the tail


def test_an_int4_variant_is_measured_and_judged_like_the_others(tmp_path: Path) -> None:
    """int4 (MatMulNBits, onnxruntime's own quantizer) beside fp32: its TPOT and RSS measured, its fidelity against
    the fp32 reference read; on this decoder (2 layers of 64, random weights) 4 bits move the logits past the floor."""
    import onnx

    timing = {"prompt_lengths": [16, 64], "tpot_tokens": 32, "repeats": 3, "greedy_tokens": 32}
    pkg = write_generative_package(tmp_path / "lm", variants=("int4",), layers=2, hidden=64, heads=2, timing=timing)
    ops = {n.op_type for n in onnx.load(str(pkg / "int4" / "model.onnx")).graph.node}
    assert "MatMulNBits" in ops, ops
    assert check_generative(pkg) == []
    save = tmp_path / "d.json"
    res = CliRunner().invoke(cli, ["qualify", str(pkg), "--provider", "cpu", "--save", str(save)])
    assert res.exit_code == 0, res.output
    doc = json.loads(save.read_text())
    rows = {r["key"]: r for r in doc["results"]}
    ref, int4 = rows["onnxruntime-genai/cpu:fp32"], rows["onnxruntime-genai/cpu:int4"]
    assert ref["status"] == "passed" and int4["tpot_ms"]["p50_ms"] > 0 and int4["peak_rss_bytes"] > 0
    assert 0 < int4["fidelity"]["top1"] < doc["gates"]["min_top1"], int4["fidelity"]
    assert int4["status"] == "failed" and "under the floor" in int4["reason"], int4
    assert doc["selected"] == "onnxruntime-genai/cpu:fp32"
