"""How one optimizer step's global batch is split over data-parallel ranks and micro-batches.

Rank r computes its part (`rank_part`): global_batch // ranks samples, one more for each of the first
global_batch % ranks ranks, so a rank count that does not divide the batch still computes exactly the batch. A
rank's part goes in pieces of at most the micro-batch, the last one shorter where it does not divide
(`TrainShape.micro_parts`); ELASTICO_ACCUMULATION is the largest part's count of pieces (`accumulation_for`).
Each piece's mean loss is weighted by its samples over the global batch and the ranks' gradients summed, so
every split computes the same step (`runtime.train`). Pure arithmetic: the runtime, the family specs and the
simulator all split by it.
"""

from __future__ import annotations


def rank_part(global_batch: int, ranks: int, rank: int) -> tuple[int, int]:
    """(first sample, samples) of rank `rank`'s part of a global batch split over `ranks`: global_batch // ranks
    each, one more for each of the first global_batch % ranks (a count that does not divide the batch still
    computes exactly the batch: no sample twice, none left out)."""
    base, extra = divmod(global_batch, ranks)
    return rank * base + min(rank, extra), base + (rank < extra)


def largest_part(global_batch: int, ranks: int) -> int:
    """Samples of the largest rank part (rank 0's, `rank_part`): the part that sets a step's pace."""
    return -(-global_batch // ranks)


def accumulation_for(global_batch: int, micro_batch: int, ranks: int) -> int:
    """Micro-batches of `micro_batch` the largest rank part of `global_batch` over `ranks` takes (ELASTICO_ACCUMULATION
    of that split: global_batch / (micro_batch x ranks) when they divide it)."""
    return -(-largest_part(global_batch, ranks) // micro_batch)


def split_problem(global_batch: int, micro: int, accumulation: int, ranks: int) -> str:
    """Why `accumulation` micro-batches of `micro` on `ranks` ranks are not a split of `global_batch` ("": they are):
    the largest rank part (`rank_part`) must take exactly `accumulation` pieces of at most `micro`."""
    largest = largest_part(global_batch, ranks)
    if ranks > global_batch:
        return f"{ranks} ranks for {global_batch} samples leave a rank without any; allowed: at most {global_batch} ranks"
    if micro > largest:
        return f"micro_batch {micro} is larger than a rank's part ({largest}); allowed: at most {largest}"
    want = accumulation_for(global_batch, micro, ranks)
    if accumulation != want:
        return f"a rank's part of {largest} samples takes {want} micro-batches of at most {micro}, not {accumulation}"
    return ""


def offered(global_batch: int, ranks: int, micro: int) -> bool:
    """Whether a family offers micro-batch `micro` on `ranks` ranks (`shapes.spec`): one that splits each rank's
    part into equal pieces where the ranks divide `global_batch`, else any no larger than the largest part."""
    if global_batch % ranks == 0:
        return (global_batch // ranks) % micro == 0
    return ranks <= global_batch and micro <= largest_part(global_batch, ranks)
