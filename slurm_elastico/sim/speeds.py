"""How fast a started job runs alone, from the ground truth: the engine's solo speeds.

A job's speed alone depends on its shape, its share, its placement (the GPUs
it holds on each node) and, for a training job at another global batch than
its own, the epoch of its statistical efficiency; the engine keeps one per
job (`solo`) and recomputes it only when one of those changed. Its speed next
to others is the ground truth's co-location rule on top (`Engine._rerate`).

On a cluster of GPU types the speed is that of the type of the GPUs the job
holds (`_typed_solo`, `truth_types.TypedTruth`), a gang across types at its
slowest rank's pace.

`JobSpeeds` is a mixin of `sim.engine.Engine`, which holds the ground truth
(`truth`, and `types` on a cluster of GPU types), the settings (`sim`), the
cluster, whether goodput shapes exist (`adaptive`) and the cache (`solo`).
"""

from __future__ import annotations

from slurm_elastico.shapes.units import PERCENT, percent_of
from slurm_elastico.sim.families import efficiency_epoch, efficiency_segment
from slurm_elastico.sim.job import SimJob


class JobSpeeds:
    """The engine's solo speeds of its started jobs (a mixin of `Engine`)."""

    def _solo(self, job: SimJob) -> tuple[float, float, tuple[str, int]]:
        """(speed at its share, speed at a whole GPU, Gavel identity) of a started job, from the ground truth.

        A job holding whole GPUs (`gpus:N`) runs data-parallel on its placement: `truth.gang_speed`; one GPU of a
        rigid job keeps `rigid_speed`, so one-GPU figures stay those of the single-GPU rule.
        """
        placement = job.placement
        typed = self.cluster.typed_placement(job) if self.types is not None else ()
        key = (job.shape, job.share, typed or placement, self._stat_epoch(job))
        got = self.solo.get(job.job_id)
        if got is not None and got[3] == key:
            return got[:3]
        tj, t = job.trace, self.truth
        if typed:
            val = self._typed_solo(job, typed)
        elif job.family is None:
            speed = (t.gang_speed(tj.app, tj.global_batch, placement) if sum(placement) > 1
                     else t.rigid_speed(tj.app, tj.global_batch, 1))
            val = (speed, speed, t.identity(tj.kind, tj.app, tj.global_batch))
        elif job.whole:
            val = self._gang_solo(job, placement)
        else:
            shape = shape_of(job)
            pct = percent_of(job.share, self.cluster.shares_per_gpu)  # the truth speaks percent of a GPU
            if tj.kind == "train":
                m = int(shape.knob("micro_batch"))
                b = int(shape.knob("global_batch", tj.global_batch))
                f = efficiency_segment(t, tj, b, job.done)[0]
                val = (t.train_speed(tj.app, b, m, pct) * f, t.train_speed(tj.app, b, m, PERCENT) * f,
                       t.identity("train", tj.app, m))
            else:
                args = (tj.context_tokens, tj.generated_tokens, float(shape.knob("gpu_memory_utilization")),
                        int(shape.knob("max_num_seqs")), str(shape.knob("kv_cache_dtype")))
                mem = float(self.sim.gpu_memory_mib)
                val = (t.infer_speed(*args, pct, mem), t.infer_speed(*args, PERCENT, mem),
                       t.identity("infer", tj.app, args[3]))
        self.solo[job.job_id] = (*val, key)
        return val

    def _gang_solo(self, job: SimJob, placement: tuple[int, ...]) -> tuple[float, float, tuple[str, int]]:
        """A family job on whole GPUs: its shape's micro-batch and global batch on the GPUs it really holds.

        Inference holds one engine per GPU (independent replicas), so its speed is one engine's times the GPUs.
        """
        tj, t = job.trace, self.truth
        shape = shape_of(job)
        if tj.kind == "train":
            m = int(shape.knob("micro_batch"))
            b = int(shape.knob("global_batch", tj.global_batch))
            speed = t.gang_speed(tj.app, b, placement, m) * efficiency_segment(t, tj, b, job.done)[0]
            return speed, speed, t.identity("train", tj.app, m)
        args = (tj.context_tokens, tj.generated_tokens, float(shape.knob("gpu_memory_utilization")),
                int(shape.knob("max_num_seqs")), str(shape.knob("kv_cache_dtype")))
        speed = t.infer_speed(*args, PERCENT, float(self.sim.gpu_memory_mib)) * sum(placement)
        return speed, speed, t.identity("infer", tj.app, args[3])

    def _typed_solo(self, job: SimJob, typed: tuple[tuple[str, int], ...]) -> tuple[float, float, tuple[str, int]]:
        """`_solo` on a cluster of GPU types: the truth of the type of the GPUs the job holds (`TypedTruth`; a gang
        across types at its slowest rank's pace). Training only (`families_typed.check_typed`)."""
        tj, types = job.trace, self.types
        if job.family is None:
            speed = types.rigid_speed(tj.app, tj.global_batch, typed)
            return speed, speed, self.truth.identity(tj.kind, tj.app, tj.global_batch)
        shape = shape_of(job)
        m = int(shape.knob("micro_batch"))
        b = int(shape.knob("global_batch", tj.global_batch))
        f = efficiency_segment(self.truth, tj, b, job.done)[0]
        me = self.truth.identity("train", tj.app, m)
        if job.whole:
            speed = types.gang_speed(tj.app, b, typed, m) * f
            return speed, speed, me
        gpu_type = typed[0][0]
        pct = percent_of(job.share, self.cluster.shares_per_gpu)
        return (types.train_speed(gpu_type, tj.app, b, m, pct) * f, types.train_speed(gpu_type, tj.app, b, m, PERCENT)
                * f, me)

    def _stat_epoch(self, job: SimJob) -> int:
        """The epoch of statistical efficiency a training family job is in when goodput shapes exist, else -1."""
        if not self.adaptive or job.family is None or job.trace.kind != "train":
            return -1
        return efficiency_epoch(self.truth, job.trace, job.done)


def shape_of(job: SimJob):
    """The family shape a started job runs as (its default when the name is not one of its shapes)."""
    try:
        return job.family.shape(job.shape)
    except KeyError:
        return job.family.default_shape
