"""The tiny decoder (agent.generative.tinygraph, the same weights for the same shape and seed) in the layout OpenVINO
GenAI's LLMPipeline loads, made in code (nothing fetched from a hub).

write_tiny_openvino(DIR) writes:
    DIR/openvino_model.xml/.bin        the ONNX decoder converted by openvino.convert_model, made stateful as
                                       LLMPipeline 2026.4 requires: inputs input_ids, attention_mask, position_ids and
                                       beam_idx (int32 [batch]: each past is gathered by it), output logits; the KV
                                       cache is ReadValue/Assign pairs (past_key_values.N.* -> present.N.*) whose
                                       initial value is zeros [batch, heads, 0, head_size] (a ReadValue without one
                                       fails to compile on CPU: "ReadValue ... contains less parent edges than 0")
    DIR/openvino_tokenizer.xml/.bin    a trie tokenizer of the 256 bytes plus <|endoftext|> (the ids of tinymodel's
                                       byte-level BPE without merges), outputs input_ids and attention_mask (i64:
                                       LLMPipeline reads both; openvino_tokenizers' build_rwkv_tokenizer has no mask)
    DIR/openvino_detokenizer.xml/.bin  its inverse (VocabDecoder), rt_info eos/bos/pad_token_id = 256
"""

from __future__ import annotations

import tempfile
from pathlib import Path
from typing import Any

import numpy as np

from agent.generative.tinymodel import EOS, Tiny

FILES = ("openvino_model.xml", "openvino_tokenizer.xml", "openvino_detokenizer.xml")


def _stateful(model: Any) -> Any:
    """Make the converted decoder stateful: beam_idx reorders each past, past/present pairs become ReadValue/Assign
    with a zero initial value of the batch's size (as optimum-intel's export does)."""
    from openvino import Type
    from openvino import opset13 as ops
    from openvino._offline_transformations import apply_make_stateful_transformation

    beam = ops.parameter([-1], Type.i32, name="beam_idx")
    beam.output(0).get_tensor().set_names({"beam_idx"})
    pairs = {}
    axis0 = ops.constant(np.array(0, np.int64))
    for p in model.get_parameters():
        name = p.get_output_tensor(0).get_any_name()
        if name.startswith("past_key_values."):
            consumers = list(p.output(0).get_target_inputs())
            gathered = ops.gather(p, beam, axis0)
            for c in consumers:
                c.replace_source_output(gathered.output(0))
            _, layer, kind = name.split(".")
            pairs[name] = f"present.{layer}.{kind}"
    model.add_parameters([beam])
    apply_make_stateful_transformation(model, pairs)
    ids = model.input("input_ids")
    batch = ops.gather(ops.shape_of(ids, output_type="i64"), ops.constant(np.array([0], np.int64)), axis0)
    for op in model.get_ops():
        if op.get_type_name() == "ReadValue":
            dims = [d.get_min_length() for d in op.get_output_partial_shape(0)]
            shape = ops.concat([batch] + [ops.constant(np.array([d], np.int64)) for d in dims[1:]], 0)
            op.set_arguments([ops.broadcast(ops.constant(np.array(0.0, np.float32)), shape)])
    model.validate_nodes_and_infer_types()
    return model


def tokenizer_models(vocab: list[bytes]) -> tuple[Any, Any]:
    """(tokenizer, detokenizer) openvino Models for a vocabulary of byte strings (id = index), longest match first."""
    from openvino import Model, PartialShape, Type, op
    from openvino import opset12 as ops
    from openvino.utils.types import make_constant_node
    from openvino_tokenizers import _get_factory, _get_opset_factory
    from openvino_tokenizers.tokenizer_pipeline import TokenizerPipeline, TrieTokenizerStep
    from openvino_tokenizers.utils import create_string_constant_node

    text = op.Parameter(Type.string, PartialShape(["?"]))
    out = _get_opset_factory("opset15").create("StringTensorUnpack", text.outputs()).outputs()
    trie = TrieTokenizerStep(vocab, list(range(len(vocab))))
    out = trie.get_ov_subgraph(TokenizerPipeline.add_ragged_dimension(out))
    longest = ops.reduce_max(ops.subtract(out[1], out[0]), make_constant_node(0, Type.i32))
    zero = make_constant_node(0, Type.i32)
    dense = _get_factory().create("RaggedToDense", [*out, *longest.outputs(), *zero.outputs()]).outputs()
    ids = ops.convert(dense[0], "i64").output(0)
    ids.get_tensor().set_names({"input_ids"})
    mask = ops.convert(dense[1], "i64").output(0)
    mask.get_tensor().set_names({"attention_mask"})
    tokenizer = Model([ids, mask], [text], "tokenizer")
    tokens = op.Parameter(Type.i64, PartialShape(["?", "?"]))
    words = _get_factory().create(
        "VocabDecoder", [*ops.convert(tokens, "i32").outputs(), *create_string_constant_node(trie.vocab)]
    )
    *ragged, chars = words.outputs()
    joined = _get_factory().create("FuzeRagged", ragged).outputs() + [chars]
    strings = _get_opset_factory("opset15").create("StringTensorPack", joined).outputs()
    strings[0].get_tensor().set_names({"string_output"})
    return tokenizer, Model(strings, [tokens], "detokenizer")


def write_tiny_openvino(directory: Path, **shape: Any) -> Path:
    """Write Tiny(**shape) (the onnxruntime-genai package's decoder: the same weights for the same shape and seed) in
    OpenVINO GenAI's layout into `directory` (created); return it."""
    import onnx
    import openvino as ov

    from agent.generative.tinygraph import decoder

    t = Tiny(**shape)
    directory.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tiny-ov-") as tmp:
        onnx.save(decoder(t), str(Path(tmp) / "model.onnx"))
        model = _stateful(ov.convert_model(str(Path(tmp) / "model.onnx")))
    ov.save_model(model, str(directory / "openvino_model.xml"), compress_to_fp16=False)
    tok, detok = tokenizer_models([bytes([b]) for b in range(256)] + [b"<|endoftext|>"])
    for m in (tok, detok):
        for key in ("eos_token_id", "bos_token_id", "pad_token_id"):
            m.set_rt_info(EOS, key)
    ov.save_model(tok, str(directory / "openvino_tokenizer.xml"))
    ov.save_model(detok, str(directory / "openvino_detokenizer.xml"))
    return directory
