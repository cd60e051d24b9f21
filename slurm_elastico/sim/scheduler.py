"""Slurm's own scheduler on the simulated cluster: which pending job starts now, where, and what backfill keeps.

`SlurmScheduler.schedule`: pending jobs in priority order (then submit
time, then id), each at its requested GRES — `mps:N` on one GPU with N free
shares (the lowest-index one of the first node that has one, or of the
first node of its pin: first fit, as measured on Slurm,
`planner.gpu_choice`), `gpus:N` on N idle whole GPUs (no MPS user; on a
Slurm other than 24.11, `slurm_version`, only the lowest of a node not held
whole) of as few
nodes as it takes: the one node with the fewest idle GPUs that still has N
(best fit), else nodes by most idle GPUs first; pinned, only on its nodes
and at least one GPU on each (Slurm's NodeList= is required nodes); a
request set per node (`Gres=gpu:P NumNodes=K-K`) takes P on each of its K
nodes (one node when unpinned). A gang's
CPUs and host memory are for the whole job, split over its nodes in
proportion to its GPUs there (rounded up per node) and checked per node.
A request naming a GPU type (`gpu:TYPE:N`, `GresRequest.gpu_type`) goes only
on nodes of that type (`SimCluster.on_type`), one naming none on any node.
A job goes only on nodes of the partitions it was submitted to
(`TraceJob.partition`; `SimJob.reach`), a gang within one of them (tried in
name order); a job pinned outside them never starts, as in Slurm, which
takes such a NodeList= and leaves the job pending.
Backfill without time limits: the first job that cannot start reserves the
GPU (mps) or whole nodes (gpus) it is closest to fitting on, and later jobs
may start anywhere else; on a cluster of partitions, the first such job of
each set of nodes no reservation touches yet (each partition's blocked head
keeps its own, as Slurm's scheduler blocks a partition at its first job
that cannot start). Slurm knows no GPU memory, so jobs it starts may
overcommit it; those are counted. (A job submitted with `--gres=gpu:N` is
not simulated: nothing submits it here; the GPU-count actions set it.)

The scheduler is a mixin of `sim.cluster.SimCluster`: it reads the cluster's
nodes, free shares and queue, and starts jobs through the cluster's `start`.
"""

from __future__ import annotations

from slurm_elastico.sim.job import SimJob


class SlurmScheduler:
    """Slurm's scheduler and backfill over a `SimCluster`'s state (a mixin of `SimCluster`, which holds `nodes`,
    `free`, `open`, `queue`, `jobs` and `start`)."""

    def schedule(self) -> list[SimJob]:
        """Start what Slurm would start now; returns the jobs it started."""
        if not self.open:
            return []
        open_gpus = [self.gpu_key[g] for g in sorted(self.open)]
        top = max(self.free[g] for g in self.open)
        started: list[SimJob] = []
        reserved: set[tuple[int, int]] = set()
        reserved_nodes: set[int] = set()
        for _, jid in list(self.queue):
            job = self.jobs[jid]
            if job.held or job.begin > self.now:
                continue
            blocked = not self._reserved_in(job, reserved, reserved_nodes)
            too_big = not job.whole and job.gres.count > top
            if too_big and not blocked:
                continue  # cannot fit anywhere: skip the search
            where = None if too_big else self._fit(job, open_gpus, reserved, reserved_nodes)
            if where is not None:
                self.start(job, where)
                started.append(job)
                if not self.open:
                    break
                open_gpus = [self.gpu_key[g] for g in sorted(self.open)]
                top = max(self.free[g] for g in self.open)
            elif blocked:
                self._reserve(job, open_gpus, reserved, reserved_nodes)
        return started

    def _reserved_in(self, job: SimJob, reserved, reserved_nodes) -> bool:
        """Whether some job ahead holds a reservation on nodes `job` may run on (its partitions'; any: anywhere)."""
        if job.within is None:
            return bool(reserved or reserved_nodes)
        return any(ni in job.within for ni in reserved_nodes) or any(ni in job.within for ni, _ in reserved)

    def _fit(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> tuple[tuple[int, int], ...] | None:
        if job.whole:
            return self._fit_gang(job, open_gpus, reserved, reserved_nodes)
        pin = self.node_index.get(job.pin[0]) if job.pin else None
        need = job.gres.count
        best: tuple[int, int] | None = None
        for ni, gi in open_gpus:  # first fit in node and GPU order, as Slurm picks (`planner.gpu_choice.mps_gpu`)
            if (pin is not None and ni != pin) or (ni, gi) in reserved or ni in reserved_nodes \
                    or not self.may_run(ni, job):
                continue
            if self.gpu_free(ni, gi) >= need and self._host_fits(ni, job):
                best = (ni, gi)
                break
        if best is None:
            return None
        if self._gpu_mem_used(*best) + self._gpu_mem_of(job) > self.nodes[best[0]].gpu_mem_mib:
            self.counters.memory_overcommits += 1
        return (best,)

    def _idle(self, open_gpus, reserved, reserved_nodes) -> dict[int, list[int]]:
        """The idle GPUs (no user at all) per node that `gpus:N` may take, outside the reservation, in node and GPU
        order: on 24.11 (`lowest_unused`) every one; otherwise only those below the node's lowest GPU that is
        neither held whole nor idle (`planner.gpu_choice.whole_gpus`: Slurm takes the lowest GPUs not held whole,
        MPS users or not). 22.05 would then start the job beside those MPS users; that is not modelled: here it
        waits for them to leave."""
        idle: dict[int, list[int]] = {}
        if self.lowest_unused:
            for ni, gi in open_gpus:
                if ni not in reserved_nodes and (ni, gi) not in reserved and not self.nodes[ni].gpus[gi]:
                    idle.setdefault(ni, []).append(gi)
            return idle
        for ni in sorted({ni for ni, _ in open_gpus} - set(reserved_nodes)):
            for gi, uses in enumerate(self.nodes[ni].gpus):
                if any(u.whole for u in uses.values()):
                    continue
                if uses or (ni, gi) in reserved:
                    break
                idle.setdefault(ni, []).append(gi)
        return idle

    def _fit_gang(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> tuple[tuple[int, int], ...] | None:
        """`gpus:N` on idle GPUs of one of its partitions (`_fit_gang_in`)."""
        for nodes in job.reach or (None,):
            alloc = self._fit_gang_in(job, nodes, open_gpus, reserved, reserved_nodes)
            if alloc is not None:
                return alloc
        return None

    def _fit_gang_in(self, job: SimJob, nodes: frozenset[int] | None, open_gpus, reserved,
                     reserved_nodes) -> tuple[tuple[int, int], ...] | None:
        """`gpus:N` on idle GPUs of `nodes` (None: any): one node (best fit), else most idle nodes first; pinned: on
        each of its nodes."""
        n = job.gres.count
        idle = {ni: gs for ni, gs in self._idle(open_gpus, reserved, reserved_nodes).items()
                if self.on_type(ni, job) and (nodes is None or ni in nodes)}

        def room(ni: int, k: int) -> int:
            """How many of k GPUs node ni can take: idle ones whose share of the host still fits."""
            k = min(k, len(idle.get(ni, ())))
            while k > 0 and not self._host_fits(ni, job, k, n):
                k -= 1
            return k

        most_idle = lambda ni: (-len(idle.get(ni, ())), ni)  # noqa: E731
        take: dict[int, int] = {}
        if job.per_node:  # P on each of its K nodes, exactly
            pins = sorted({self.node_index.get(name, -1) for name in job.pin})
            if job.pin:
                p = n // len(pins)
                if pins[0] < 0 or n % len(pins) or any(room(ni, p) < p for ni in pins):
                    return None
                take = dict.fromkeys(pins, p)
            else:
                whole_node = [ni for ni in idle if room(ni, n) == n]
                if not whole_node:
                    return None
                take = {min(whole_node, key=lambda ni: (len(idle[ni]), ni)): n}
            left = 0
        elif job.pin:
            pins = sorted({self.node_index.get(name, -1) for name in job.pin})
            if pins[0] < 0 or n < len(pins) or any(room(ni, 1) < 1 for ni in pins):
                return None
            take = dict.fromkeys(pins, 1)
            left = n - len(pins)
            for ni in sorted(pins, key=most_idle):
                extra = room(ni, take[ni] + left) - take[ni]
                take[ni] += extra
                left -= extra
        else:
            whole_node = [ni for ni in idle if room(ni, n) == n]
            if whole_node:
                take = {min(whole_node, key=lambda ni: (len(idle[ni]), ni)): n}
                left = 0
            else:
                left = n
                for ni in sorted(idle, key=most_idle):
                    k = room(ni, left)
                    if k:
                        take[ni] = k
                        left -= k
                    if not left:
                        break
        if left:
            return None
        alloc = tuple((ni, gi) for ni, k in sorted(take.items()) for gi in idle[ni][:k])
        if self._gpu_mem_of(job) > min(self.nodes[ni].gpu_mem_mib for ni in take):
            self.counters.memory_overcommits += 1
        return alloc

    def _fits_empty(self, job: SimJob, nodes: list[int]) -> bool:
        """Whether gang `job` would fit on `nodes` (pinned: on each of them) if they were empty."""
        if not nodes or nodes[0] < 0 or (job.pin and not all(self.on_type(ni, job) for ni in nodes)):
            return False
        nodes = [ni for ni in nodes if self.on_type(ni, job)]
        n = job.gres.count

        def room(ni: int, k: int) -> int:
            node = self.nodes[ni]
            k = min(k, len(node.gpus))
            while k > 0 and not all(a <= b for a, b in zip(self.host_share(job, k, n), (node.cpus, node.mem_mib))):
                k -= 1
            return k

        if job.per_node:
            k = max(1, len(job.pin))
            return n % k == 0 and (all(room(ni, n // k) >= n // k for ni in nodes) if job.pin
                                   else any(room(ni, n) >= n for ni in nodes))
        if job.pin and (n < len(nodes) or any(room(ni, 1) < 1 for ni in nodes)):
            return False
        return sum(room(ni, n) for ni in nodes) >= n

    def _host_fits(self, ni: int, job: SimJob, k: int = 1, total: int = 1) -> bool:
        """Whether node ni has the CPUs and memory for `job` holding k of its `total` GPUs there."""
        n = self.nodes[ni]
        cpus, mem = self.host_share(job, k, total)
        return n.cpus - n.cpus_alloc >= cpus and n.mem_mib - n.mem_alloc >= mem

    def _gpu_mem_of(self, job: SimJob) -> int:
        if job.family is None:
            return 0
        try:
            return job.family.shape(job.shape_name(self.shares_per_gpu)).resources.gpu_mem_mib
        except KeyError:
            return job.family.default_shape.resources.gpu_mem_mib

    def _gpu_mem_used(self, ni: int, gi: int) -> int:
        return sum(self._gpu_mem_of(self.jobs[j]) for j in self.nodes[ni].gpus[gi])

    def _reserve(self, job: SimJob, open_gpus, reserved, reserved_nodes) -> None:
        """The blocked head keeps what it is closest to fitting on, so backfill cannot starve it.

        A gang keeps whole nodes: its pinned nodes, else the nodes with the most idle GPUs until they hold
        its N GPUs. A request its nodes could not hold even empty keeps nothing (a share: no node with its
        CPUs and memory): Slurm's backfill finds no start time for it, and holding nodes for it would starve
        the rest for ever.
        """
        if job.whole:
            self._reserve_gang(job, open_gpus, reserved_nodes)
            return
        pin = self.node_index.get(job.pin[0]) if job.pin else None
        cpus, mem = self.host_share(job, 1, 1)
        cands = [(ni, gi) for ni, gi in open_gpus if (pin is None or ni == pin) and self.may_run(ni, job)
                 and cpus <= self.nodes[ni].cpus and mem <= self.nodes[ni].mem_mib]
        if cands:
            reserved.add(max(cands, key=lambda k: (self.gpu_free(*k), -k[0], -k[1])))

    def _reserve_gang(self, job: SimJob, open_gpus, reserved_nodes) -> None:
        """A blocked gang keeps whole nodes of the first of its partitions it would fit in empty (`_reserve`)."""
        n = job.gres.count
        for nodes in job.reach or (None,):
            pins = sorted({self.node_index.get(name, -1) for name in job.pin}) if job.pin else \
                [ni for ni in range(len(self.nodes)) if nodes is None or ni in nodes]
            if (nodes is not None and not nodes.issuperset(pins)) or not self._fits_empty(job, pins):
                continue
            if job.pin:
                reserved_nodes.update(pins)
                return
            idle = self._idle(open_gpus, (), ())
            held = 0
            typed = [ni for ni in pins if self.on_type(ni, job)]
            for ni in sorted(typed, key=lambda ni: (-len(idle.get(ni, ())), ni)):
                if held >= n:
                    break
                reserved_nodes.add(ni)
                held += len(self.nodes[ni].gpus)
            return
