"""The tiny local Hugging Face model directory: loadable, and the same seed writes the same files."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers", reason="transformers is not installed: install the 'cpu-infer' extra")


def test_same_seed_same_files_other_seed_other_weights(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from slurm_elastico.runtime.tinyhf import build_tiny_model_dir

    a, b, c = (build_tiny_model_dir(tmp_path / name, seed) for name, seed in (("a", 0), ("b", 0), ("c", 1)))
    names = sorted(p.name for p in a.iterdir())
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(names)
    assert all((a / n).read_bytes() == (b / n).read_bytes() for n in names)
    assert (a / "model.safetensors").read_bytes() != (c / "model.safetensors").read_bytes()
    assert (a / "tokenizer.json").read_bytes() == (c / "tokenizer.json").read_bytes()

    tok = AutoTokenizer.from_pretrained(a)
    ids = tok("Write one line about GPUs. ünïcode").input_ids
    assert tok.decode(ids) == "Write one line about GPUs. ünïcode"  # byte-level: any text round-trips
    assert AutoModelForCausalLM.from_pretrained(a).config.vocab_size == len(tok)
