"""Data-parallel membership for the training loop: torch's env:// variables, a process group, and its collectives.

`elastico-run` starts one process per rank and sets torch's env:// variables
(RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR, MASTER_PORT) plus the same
ELASTICO_* shape variables on every rank. `membership()` reads and checks
them against the shape's `ranks` (pure; a ConfigError names every problem).
With WORLD_SIZE absent or 1 there is no process group and `Group` does
nothing, so a one-rank run is exactly the single-process loop.

Backend: gloo when the model is on the CPU, nccl on CUDA. Only the gloo path
is tested here (there is no GPU on the test machines); the nccl path is the
same calls with the tensors on the rank's GPU (`local_device()` picks
cuda:LOCAL_RANK), untested.

The collectives the loop needs, all summed or maxed in a fixed order so a
rerun at the same world size is bit-identical:
  - `sum_grads(params)`: every rank's gradients summed into every rank's
    `.grad` (one flat buffer per dtype); a parameter keeps `grad=None` only
    when no rank produced a gradient for it, as a single process would.
  - `any(flag)`: true on every rank when any rank said true (the stop decision).
  - `max_ints(values)`: each value's largest over the ranks (goodput mode's stop decision together with
    a new batch that rank 0 alone offers: `runtime.rebatch`).
  - `broadcast_module(module)`: rank 0's parameters and buffers on every rank.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch import nn

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime.env_reader import EnvReader

log = logging.getLogger(__name__)

_SOURCE = "rank environment (torch env:// variables)"


@dataclass(frozen=True)
class Membership:
    """This process's place in the data-parallel job: rank `rank` of `world`, GPU `local_rank` on its node."""

    rank: int = 0
    world: int = 1
    local_rank: int = 0

    @property
    def is_main(self) -> bool:
        """Rank 0 writes checkpoints and progress reports."""
        return self.rank == 0


def membership(
    shape_ranks: int, env: Mapping[str, str] | None = None, *, variable: str = "ELASTICO_RANKS", rendezvous: bool = True
) -> Membership:
    """This process's membership from the env:// variables, checked against the shape's `ranks`.

    WORLD_SIZE absent means 1. A WORLD_SIZE that differs from `shape_ranks`
    (the shape's `variable`), a RANK or LOCAL_RANK that is missing or out of
    range, or (with `rendezvous`, for a process group) a missing
    MASTER_ADDR/MASTER_PORT when WORLD_SIZE > 1 raise one ConfigError naming each.
    Inference replicas use it with variable="ELASTICO_REPLICAS", rendezvous=False.
    """
    r = EnvReader(os.environ if env is None else env, _SOURCE)
    world = r.integer("WORLD_SIZE", required=False)
    if world is None:
        if r.problems:
            raise ConfigError(_SOURCE, r.problems)
        world = 1
    if world != shape_ranks:
        r.problems.append(
            f"WORLD_SIZE={world} but the shape has {variable}={shape_ranks}; the launcher must start one process per rank"
        )
    rank = r.integer("RANK", required=world > 1, minimum=0)
    if rank is None and world == 1:
        rank = 0  # one process: RANK may be absent
    local = r.integer("LOCAL_RANK", required=False, minimum=0)
    if rendezvous and world > 1:
        for name in ("MASTER_ADDR", "MASTER_PORT"):
            if not r.env.get(name, "").strip():
                r.problems.append(f"{name} is not set; a process group of {world} ranks needs the rendezvous address")
    if rank is not None and rank >= world:
        r.problems.append(f"RANK={rank} is not below WORLD_SIZE={world} (allowed 0..{world - 1})")
    if r.problems:
        raise ConfigError(_SOURCE, r.problems)
    return Membership(rank=rank, world=world, local_rank=rank if local is None else local)  # type: ignore[arg-type]


def local_device(env: Mapping[str, str] | None = None) -> torch.device:
    """The device of this rank: cuda:LOCAL_RANK when CUDA is present, else the CPU."""
    env = os.environ if env is None else env
    if torch.cuda.is_available():
        return torch.device("cuda", int(env.get("LOCAL_RANK", "0") or 0))
    return torch.device("cpu")


class Group:
    """The process group of a data-parallel run (a no-op for one rank); use as a context manager.

    Joins the default process group through env:// when WORLD_SIZE > 1 (gloo
    for a CPU device, nccl for CUDA), or uses one the program already made
    (its size must match), and leaves only a group it made itself.
    """

    def __init__(self, member: Membership, device: torch.device):
        self.member = member
        self.device = device
        self._owned = False

    def __enter__(self) -> Group:
        if self.member.world == 1:
            return self
        if dist.is_initialized():
            if dist.get_world_size() != self.member.world or dist.get_rank() != self.member.rank:
                raise ConfigError(
                    _SOURCE,
                    [f"a process group of {dist.get_world_size()} ranks (this is rank {dist.get_rank()}) already exists,"
                     f" but WORLD_SIZE={self.member.world}, RANK={self.member.rank}"],
                )
            return self
        backend = "nccl" if self.device.type == "cuda" else "gloo"
        if backend == "nccl":
            torch.cuda.set_device(self.device)
        dist.init_process_group(backend, init_method="env://", rank=self.member.rank, world_size=self.member.world)
        self._owned = True
        log.info("joined a %s process group as rank %d of %d", backend, self.member.rank, self.member.world)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._owned:
            dist.destroy_process_group()
            self._owned = False

    @property
    def active(self) -> bool:
        return self.member.world > 1

    def barrier(self) -> None:
        if self.active:
            dist.barrier()

    def any(self, flag: bool) -> bool:
        """True on every rank when `flag` is true on any rank (a max all-reduce)."""
        if not self.active:
            return flag
        t = torch.tensor([1 if flag else 0], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return bool(t.item())

    def max_ints(self, values: list[int]) -> list[int]:
        """Each of `values`, the largest over the ranks (one max all-reduce); `values` as they are with one rank."""
        if not self.active:
            return list(values)
        t = torch.tensor(values, dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        return [int(v) for v in t.tolist()]

    def agreed_step(self, step: int) -> int:
        """`step` when every rank has the same one; a ConfigError otherwise (the ranks loaded different checkpoints)."""
        if not self.active:
            return step
        t = torch.tensor([step, -step], dtype=torch.int64, device=self.device)
        dist.all_reduce(t, op=dist.ReduceOp.MAX)
        high, low = int(t[0].item()), -int(t[1].item())
        if high != low:
            raise ConfigError(_SOURCE, [f"the ranks resumed at different steps ({low}..{high}); they must share one checkpoint directory"])
        return step

    def sum_scalar(self, value: float) -> float:
        """The sum of `value` over the ranks (float64)."""
        if not self.active:
            return value
        t = torch.tensor([value], dtype=torch.float64, device=self.device)
        dist.all_reduce(t)
        return float(t.item())

    def sum_grads(self, params: Iterable[nn.Parameter]) -> None:
        """Replace each parameter's `.grad` by its sum over the ranks (a missing gradient counts as zero)."""
        if not self.active:
            return
        params = [p for p in params if p.requires_grad]
        present = torch.tensor([0 if p.grad is None else 1 for p in params], dtype=torch.int64, device=self.device)
        dist.all_reduce(present)
        by_dtype: dict[torch.dtype, list[nn.Parameter]] = {}
        for p, n in zip(params, present.tolist()):
            if n:
                by_dtype.setdefault(p.dtype, []).append(p)
        for group in by_dtype.values():
            flat = torch.cat([(p.grad if p.grad is not None else torch.zeros_like(p)).reshape(-1) for p in group])
            dist.all_reduce(flat)
            offset = 0
            for p in group:
                n = p.numel()
                p.grad = flat[offset : offset + n].view_as(p)
                offset += n

    def broadcast_module(self, module: nn.Module) -> None:
        """Copy rank 0's parameters and buffers into every rank's `module`."""
        if not self.active:
            return
        with torch.no_grad():
            for t in [*module.parameters(), *module.buffers()]:
                dist.broadcast(t.data, src=0)
