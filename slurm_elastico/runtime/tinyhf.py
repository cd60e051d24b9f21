"""A tiny Hugging Face model directory built locally (config + seeded weights + a trained tokenizer): no hub download.

vLLM (and transformers) load a model from a directory holding config.json,
the weights and tokenizer files. `build_tiny_model_dir` writes one: a 2-layer
Llama with random weights from a fixed seed and a byte-level BPE tokenizer
trained on a few fixed sentences, so the real `vllm.LLM` path can run on a
CPU where no model hub is reachable. The text it generates is nonsense, but
greedy decoding of it is deterministic, which is all a reshape test needs.
Trap: vLLM's CPU attention supports only some head sizes (64 is one of them),
so the head size is 64 even though the model is tiny.
"""

from __future__ import annotations

import os
from pathlib import Path

import torch

from slurm_elastico.runtime.engines import EngineUnavailableError

CORPUS = (
    "Write one line about the sea.",
    "The lighthouse keeps its light on through the night.",
    "Slurm schedules jobs on a cluster of GPUs.",
    "A checkpoint is written, flushed and renamed.",
    "Training and inference share the same machines.",
    "Reshape the job: a new batch size, the same results.",
)
SPECIAL_TOKENS = ("<s>", "</s>", "<pad>")
VOCAB_SIZE = 384


def build_tiny_model_dir(path: str | os.PathLike[str], seed: int = 0) -> Path:
    """Write a tiny Llama (weights from `seed`) and its tokenizer to `path`; the same seed gives the same files."""
    try:
        from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers  # noqa: PLC0415 - optional
        from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast  # noqa: PLC0415 - optional
    except ImportError as exc:
        raise EngineUnavailableError(f"transformers/tokenizers are not importable ({exc}); install the 'cpu-infer' extra") from exc
    out = Path(path)
    out.mkdir(parents=True, exist_ok=True)

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),  # every byte is a token: any prompt encodes
        show_progress=False,
    )
    tok.train_from_iterator(CORPUS, trainer=trainer)
    fast = PreTrainedTokenizerFast(tokenizer_object=tok, bos_token="<s>", eos_token="</s>", pad_token="<pad>")
    fast.save_pretrained(out)

    cfg = LlamaConfig(
        vocab_size=tok.get_vocab_size(),
        hidden_size=128,
        intermediate_size=256,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        initializer_range=0.1,  # wider than the usual 0.02: peaked logits, so greedy ties are unlikely
        bos_token_id=fast.bos_token_id,
        eos_token_id=fast.eos_token_id,
        pad_token_id=fast.pad_token_id,
        tie_word_embeddings=False,
        torch_dtype="float32",
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = LlamaForCausalLM(cfg).eval()
    model.save_pretrained(out, safe_serialization=True)
    return out
