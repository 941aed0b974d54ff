"""A tiny generative model made in code, in onnxruntime-genai's own layout (nothing is fetched from a hub).

write_tiny_genai(DIR) writes:
    DIR/model.onnx            a decoder of `layers` attention+MLP blocks with random weights, standard ONNX ops, and the
                              KV cache as inputs `past_key_values.%d.key/value` and outputs `present.%d.key/value`
                              ([batch, heads, past, head_size]; present = past ++ new, so `past_present_share_buffer`
                              is off)
    DIR/genai_config.json     the runtime's config (model type "llama", search.max_length)
    DIR/tokenizer.json        a byte-level BPE vocabulary of the 256 bytes plus `<|endoftext|>` (no merges)
    DIR/tokenizer_config.json GPT2Tokenizer
`perturb` adds Gaussian noise of that relative size to every weight (a variant that must fail a fidelity floor);
`gqa` makes the same model (the same weights) with com.microsoft GroupQueryAttention and a past/present buffer
shared and allocated at max_length (`past_present_share_buffer: true`), as the runtime's model builder does.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agent.generative.tinygraph import VOCAB, decoder

EOS = 256  # <|endoftext|>, the last of VOCAB


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's printable stand-in for each byte (the byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return {b: chr(c) for b, c in zip(bs, cs, strict=True)}


def tokenizer_json() -> dict[str, Any]:
    vocab = {ch: b for b, ch in _bytes_to_unicode().items()}
    eos = {
        "id": EOS,
        "content": "<|endoftext|>",
        "single_word": False,
        "lstrip": False,
        "rstrip": False,
        "normalized": False,
        "special": True,
    }
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [eos],
        "normalizer": None,
        "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True},
        "post_processor": None,
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {
            "type": "BPE",
            "dropout": None,
            "unk_token": None,
            "continuing_subword_prefix": "",
            "end_of_word_suffix": "",
            "fuse_unk": False,
            "byte_fallback": False,
            "ignore_merges": False,
            "vocab": {**vocab, "<|endoftext|>": EOS},
            "merges": [],
        },
    }


def tokenizer_config() -> dict[str, Any]:
    return {
        "tokenizer_class": "GPT2Tokenizer",
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
        "add_bos_token": False,
        "model_max_length": 4096,
        "clean_up_tokenization_spaces": False,
    }


def genai_config(*, layers: int, hidden: int, heads: int, max_length: int, shared: bool = False) -> dict[str, Any]:
    return {
        "model": {
            "bos_token_id": EOS,
            "eos_token_id": EOS,
            "pad_token_id": EOS,
            "context_length": max_length,
            "vocab_size": VOCAB,
            "type": "llama",
            "decoder": {
                "session_options": {"log_id": "onnxruntime-genai", "provider_options": []},
                "filename": "model.onnx",
                "head_size": hidden // heads,
                "hidden_size": hidden,
                "num_attention_heads": heads,
                "num_key_value_heads": heads,
                "num_hidden_layers": layers,
                "inputs": {
                    "input_ids": "input_ids",
                    "attention_mask": "attention_mask",
                    "position_ids": "position_ids",
                    "past_key_names": "past_key_values.%d.key",
                    "past_value_names": "past_key_values.%d.value",
                },
                "outputs": {
                    "logits": "logits",
                    "present_key_names": "present.%d.key",
                    "present_value_names": "present.%d.value",
                },
            },
        },
        "search": {
            "do_sample": False,
            "max_length": max_length,
            "min_length": 0,
            "num_beams": 1,
            "num_return_sequences": 1,
            "past_present_share_buffer": shared,
            "temperature": 1.0,
            "top_k": 1,
            "top_p": 1.0,
            "repetition_penalty": 1.0,
            "early_stopping": True,
            "length_penalty": 1.0,
            "no_repeat_ngram_size": 0,
            "diversity_penalty": 0.0,
        },
    }


@dataclass(frozen=True)
class Tiny:
    """The tiny decoder's shape and weights: `gqa` puts attention in GroupQueryAttention with a past/present buffer
    shared and allocated at max_length (past_present_share_buffer), as the runtime's own model builder does."""

    layers: int = 2
    hidden: int = 32
    heads: int = 2
    max_length: int = 256
    seed: int = 0
    perturb: float = 0.0
    gqa: bool = False
    idle: int = 0  # more layers with zero output projections: more compute per token, the same logits


def write_tiny_genai(directory: Path, **shape: Any) -> Path:
    """Write the tiny model (Tiny(**shape)) in onnxruntime-genai's layout into `directory` (created); return it."""
    import onnx

    t = Tiny(**shape)
    directory.mkdir(parents=True, exist_ok=True)
    model = decoder(t)
    onnx.save(model, str(directory / "model.onnx"))
    config = genai_config(
        layers=t.layers + t.idle, hidden=t.hidden, heads=t.heads, max_length=t.max_length, shared=t.gqa
    )
    (directory / "genai_config.json").write_text(json.dumps(config, indent=1))
    (directory / "tokenizer.json").write_text(json.dumps(tokenizer_json(), ensure_ascii=False))
    (directory / "tokenizer_config.json").write_text(json.dumps(tokenizer_config(), indent=1))
    return directory
