"""Where a data-parallel gang goes: idle whole GPUs as Slurm can be asked for them (`GangSearch`, a part of
`GpuState`).

A gang of n GPUs takes P on each of K nodes (`planner.gangs.even_split`: Slurm's `Gres=gpu:P NumNodes=K-K`), on
each the GPUs Slurm takes for `gpu:P` (`planner.gpu_choice.whole_gpus`), K the fewest nodes that can hold it; a job
of several partitions takes it within one of them (`gang_for`), as Slurm allocates a job in one partition. What
the epoch places only takes room away, so a gang that found none finds none until something is given back
(`GpuState.gained`): the answer is remembered.
"""

from __future__ import annotations

from slurm_elastico.planner.gangs import even_split, fewest_nodes
from slurm_elastico.planner.gpu_choice import whole_gpus
from slurm_elastico.planner.seats import Row, Seat


class GangSearch:
    """`GpuState`'s gang searches; reads the ledger `GpuState` keeps (no state of its own)."""

    def find_gang(self, row: Row, nodes: frozenset[int] | None = None) -> tuple[int, ...]:
        """Idle GPUs for a data-parallel row as Slurm can be asked for them, or () when they are not there.

        P GPUs on each of K nodes (`planner.gangs.even_split`: Slurm's `Gres=gpu:P NumNodes=K-K`), on each the
        ones Slurm takes for `gpu:P` (`gpu_choice.whole_gpus`: its P lowest not held whole, or on 24.11 its P
        lowest with no user; all idle), K the
        fewest nodes the gang can span (`gangs.fewest_nodes`; its throughput was measured there): one node
        when the gang fits a node (the one with the fewest idle GPUs that can: best fit). Idle: no occupant and
        every share free. Each node must have the CPUs and host memory for its part (the row's, in proportion to
        its GPUs there). `nodes`: the only nodes it may use (its partitions', `Seat.nodes`); None: any.
        """
        n = row.gpus
        if n <= 0 or self.max_free() <= 0:
            return ()
        if (self.all_free.get(row.gtype, 0) if row.gtype >= 0 else sum(self.all_free.values())) < n:
            return ()  # fewer GPUs of its type with every share free than it needs: no node scan
        asked = (row.gtype, n, row.mem, row.cpus, row.hmem, nodes)
        if self.no_gang.get(asked) == self.gained:
            return ()
        got = self._find_gang(row, nodes)
        if not got:
            self.no_gang[asked] = self.gained
        return got

    def gang_for(self, row: Row, seat: Seat) -> tuple[int, ...]:
        """`find_gang` for `seat`'s job: within one of its partitions (`Seat.gang_nodes`, in name order, as Slurm
        tries them), else within its nodes."""
        for nodes in seat.gang_nodes or (seat.nodes,):
            got = self.find_gang(row, nodes)
            if got:
                return got
        return ()

    def _find_gang(self, row: Row, nodes: frozenset[int] | None) -> tuple[int, ...]:
        n = row.gpus
        idle: dict[int, list[bool]] = {}
        whole: dict[int, list[bool]] = {}
        unused: dict[int, list[bool] | None] = {}
        for node, gpus in self.node_gpus.items():
            if (not self.node_all_free[node] or not self.on_type(row, gpus[0])
                    or nodes is not None and node not in nodes):
                continue  # no GPU with every share free; not its type (a node's GPUs are of one); not its partitions'
            ok, held, free = self._idle_whole(node, row.mem)
            if any(ok):
                idle[node], whole[node], unused[node] = ok, held, free
        if sum(sum(v) for v in idle.values()) < n:
            return ()

        def room(node: int, p: int) -> bool:
            return (bool(whole_gpus(idle[node], p, whole[node], unused[node]))
                    and self.node_cpu[node] >= row.cpus * p / n - 1e-9 and self.node_mem[node] >= row.hmem * p / n - 1e-9)

        size = max(len(gpus) for gpus in self.node_gpus.values())
        split = even_split(n, sorted(idle), room, lambda node: (sum(idle[node]), node), fewest_nodes(n, size))
        return tuple(self.node_gpus[node][k] for node, p in (split or {}).items()
                     for k in whole_gpus(idle[node], p, whole[node], unused[node]))
