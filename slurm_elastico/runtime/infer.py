"""Offline batch inference that survives reshapes: this replica's share of the requests, journaled per batch.

A job is a fixed set of requests, answered into a journal (`runtime.journal`:
what a resume skips, so it neither loses nor repeats a request) by an engine
(`runtime.engines`: vLLM, or the CPU engines for tests and demos), at most
`max_num_seqs` per batch, stopping at a batch boundary when a checkpoint is asked.

Replicas (`shape.replicas` = R > 1, ELASTICO_REPLICAS): R independent engine
processes share the request list, each learning its index r from RANK (and
WORLD_SIZE, which must equal R) as `elastico-run` sets them; there is no
process group. Replica r answers the requests at positions i of the request
file with i mod R = r that no journal holds yet, so the shares are disjoint
whatever the replicas have done before and whenever each starts. Each replica
appends to its own journal shard and reads every shard to skip what any
earlier launch answered; so a move between 1 and 2 replicas (or any counts)
answers each request exactly once. Each replica stops at its own batch
boundary on a reshape signal (no agreement is needed). Replica 0 writes the
progress reports, counting every shard, until its own share is done (a peer
still running after that is not reported). Trap: the split is static, so a
replica whose share was already answered by a faster peer before a relaunch
at the same R has less to do.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from slurm_elastico.errors import ElasticoError
from slurm_elastico.runtime.dist import membership
from slurm_elastico.runtime.engines import Engine
# The engines a program runs the runner with, importable from here as the users' guide first documented it.
from slurm_elastico.runtime.engines import TorchEngine, TransformersEngine, VllmEngine
from slurm_elastico.runtime.journal import Journal, JournalCorruptError, OtherShards, Request, read_requests, replica_journal
from slurm_elastico.runtime.progress import ProgressReporter
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, InferShape
from slurm_elastico.runtime.signals import checkpoint_requested

__all__ = ["InferResult", "TorchEngine", "TransformersEngine", "VllmEngine", "run_inference"]


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
    others = OtherShards(base, own)

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
