"""A tiny causal transformer language model built from a config: no downloads, for examples and tests.

It exposes `blocks` (what activation checkpointing wraps) and accepts an
attention mask with left padding (what batched greedy decoding needs). The
attention is written out rather than calling SDPA so that every op is
deterministic on CPU and behaves the same under autocast.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn


@dataclass(frozen=True)
class TinyConfig:
    vocab_size: int = 64
    max_positions: int = 64
    d_model: int = 32
    n_heads: int = 2
    n_layers: int = 2
    d_ff: int = 64


class Block(nn.Module):
    """Pre-norm transformer block: causal self-attention then an MLP, each with a residual."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.n_heads = cfg.n_heads
        self.ln1 = nn.LayerNorm(cfg.d_model)
        self.qkv = nn.Linear(cfg.d_model, 3 * cfg.d_model)
        self.proj = nn.Linear(cfg.d_model, cfg.d_model)
        self.ln2 = nn.LayerNorm(cfg.d_model)
        self.mlp = nn.Sequential(nn.Linear(cfg.d_model, cfg.d_ff), nn.GELU(), nn.Linear(cfg.d_ff, cfg.d_model))

    def forward(self, x: torch.Tensor, allowed: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        h = self.n_heads
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=-1)
        q, k, v = (z.view(b, t, h, d // h).transpose(1, 2) for z in (q, k, v))
        scores = (q @ k.transpose(-2, -1)) / math.sqrt(d // h)
        scores = scores.masked_fill(~allowed, float("-inf"))
        att = torch.softmax(scores, dim=-1)
        y = (att @ v).transpose(1, 2).reshape(b, t, d)
        x = x + self.proj(y)
        return x + self.mlp(self.ln2(x))


class TinyLM(nn.Module):
    """Token + position embeddings, `n_layers` blocks, a final norm and an untied LM head."""

    def __init__(self, cfg: TinyConfig):
        super().__init__()
        self.cfg = cfg
        self.tok = nn.Embedding(cfg.vocab_size, cfg.d_model)
        self.pos = nn.Embedding(cfg.max_positions, cfg.d_model)
        self.blocks = nn.ModuleList(Block(cfg) for _ in range(cfg.n_layers))
        self.ln_f = nn.LayerNorm(cfg.d_model)
        self.head = nn.Linear(cfg.d_model, cfg.vocab_size)

    def forward(self, ids: torch.Tensor, attention_mask: torch.Tensor | None = None) -> torch.Tensor:
        """Logits (batch, time, vocab). `attention_mask` is 1 for real tokens, 0 for left padding."""
        b, t = ids.shape
        if t > self.cfg.max_positions:
            raise ValueError(f"sequence of {t} tokens exceeds max_positions={self.cfg.max_positions}")
        causal = torch.ones(t, t, dtype=torch.bool, device=ids.device).tril()
        if attention_mask is None:
            positions = torch.arange(t, device=ids.device).expand(b, t)
            allowed = causal.expand(b, 1, t, t)
        else:
            mask = attention_mask.bool()
            positions = (mask.long().cumsum(-1) - 1).clamp(min=0)
            # A query may always see itself, so padding rows stay finite (an all -inf row gives NaN,
            # and NaN * 0 would leak into real rows); real queries never see padding keys.
            eye = torch.eye(t, dtype=torch.bool, device=ids.device)
            allowed = (causal & (mask[:, None, :] | eye))[:, None, :, :]
        x = self.tok(ids) + self.pos(positions)
        for block in self.blocks:
            x = block(x, allowed)
        return self.head(self.ln_f(x))


def build_tiny_lm(cfg: TinyConfig | None = None, seed: int = 0) -> TinyLM:
    """A TinyLM whose initial weights depend only on `cfg` and `seed` (the global RNG is left untouched)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return TinyLM(cfg or TinyConfig())


def synthetic_tokens(n_samples: int, seq_len: int, vocab_size: int, seed: int = 0) -> torch.Tensor:
    """A learnable toy corpus (n_samples, seq_len + 1): each row counts up by a fixed stride mod vocab from a random start.

    The next token is predictable from the previous two, so the loss visibly
    falls within a few dozen steps, which keeps the examples honest.
    """
    g = torch.Generator().manual_seed(seed)
    start = torch.randint(0, vocab_size, (n_samples, 1), generator=g)
    stride = torch.randint(1, 4, (n_samples, 1), generator=g)
    return (start + stride * torch.arange(seq_len + 1)) % vocab_size


def lm_loss(model: nn.Module, batch: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy over the micro-batch (rows of seq_len + 1 tokens)."""
    logits = model(batch[:, :-1])
    return nn.functional.cross_entropy(logits.float().reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
