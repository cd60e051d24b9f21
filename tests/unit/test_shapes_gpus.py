"""Shape families with a GPU-count dimension: enumeration at a fixed global batch, one error for every impossible
combination, the scaling rule of the estimate, and the partition check elastico-submit runs."""

from __future__ import annotations

import pytest

from slurm_elastico.errors import ConfigError
from slurm_elastico.model import GpuView, NodeView
from slurm_elastico.shapes import enumerate_shapes, estimate, parse_family, parse_spec
from slurm_elastico.shapes.nodes import partition_fit_problems
from slurm_elastico.shapes.spec import layout

GPU = 81920


def train_spec(**over):
    base = {"kind": "train", "global_batch": 32, "micro_batches": [4, 8, 16], "precisions": ["fp32"],
            "checkpointing": [False], "steps": 10, "mps_shares": [50, 100], "gpus": [1, 2, 4], "cpus": 1,
            "host_mem_mib": 1000}
    base.update(over)
    return base


def test_every_shape_keeps_the_global_batch_across_ranks_and_names_its_rank_count():
    shapes = enumerate_shapes(parse_spec(train_spec(), "t.yaml"), GPU)
    by_name = {s.name: s for s in shapes}
    # 1 GPU: today's names and MPS shares; n GPUs: whole GPUs, the rank count in the name.
    assert {"mb4-fp32-mps50", "mb16-fp32-mps100", "mb8-fp32-gpus4", "mb4-fp32-gpus4"} <= set(by_name)
    assert "mb16-fp32-gpus4" not in by_name  # 16 x 4 ranks > 32: no accumulation makes it
    for s in shapes:
        ranks = s.knob("ranks", 1)
        assert s.knob("micro_batch") * s.knob("accumulation") * ranks == 32 == s.knob("global_batch"), s.name
        if ranks == 1:
            assert s.resources.gpus == 0 and s.resources.mps in (50, 100) and s.name.endswith(f"mps{s.resources.mps}")
        else:
            assert s.resources.gpus == ranks and s.resources.mps == 0 and s.name.endswith(f"-gpus{ranks}")
            assert s.resources.cpus == ranks and s.resources.host_mem_mib == 1000 * ranks  # per rank
    assert by_name["mb4-fp32-gpus4"].knob("accumulation") == 2


def test_a_rank_count_that_does_not_divide_the_batch_gets_shapes_the_runtime_runs():
    # 24 samples on 5 ranks: parts of 5, 5, 5, 5 and 4; the runtime splits them exactly (runtime.split.rank_part).
    from slurm_elastico.model import Family
    from slurm_elastico.runtime.shape import runtime_shape

    shapes = {s.name: s for s in enumerate_shapes(parse_spec(train_spec(global_batch=24, micro_batches=[2, 4, 8],
                                                                        gpus=[1, 5]), "t.yaml"), GPU)}
    five = {n: s for n, s in shapes.items() if s.resources.gpus == 5}
    assert set(five) == {"mb2-fp32-gpus5", "mb4-fp32-gpus5"}  # no micro batch of 8: larger than a part
    assert [five[n].knob("accumulation") for n in sorted(five)] == [3, 2]  # 2 + 2 + 1, 4 + 1
    family = Family(kind="train", shapes=tuple(shapes.values()), total_work=10.0, name="t", default=next(iter(shapes)))
    for s in five.values():
        run = runtime_shape(family, s)
        assert (run.ranks, run.global_batch, run.accumulation) == (5, 24, s.knob("accumulation"))


def test_a_family_without_gpus_is_the_same_as_before():
    plain = enumerate_shapes(parse_spec(train_spec(gpus=[1]), "t.yaml"), GPU)
    old = enumerate_shapes(parse_spec({k: v for k, v in train_spec().items() if k != "gpus"}, "t.yaml"), GPU)
    assert plain == old and all(s.resources.gpus == 0 and s.knob("ranks") is None for s in old)


def test_every_impossible_combination_is_listed_in_one_error():
    bad = train_spec(global_batch=24, micro_batches=[4, 8], gpus=[1, 5, 6, 8, "2", 2.5], gpus_per_node=2,
                     max_nodes=2)
    with pytest.raises(ConfigError) as err:
        parse_spec(bad, "t.yaml")
    text = str(err.value)
    for needle in ("gpus[4]: expected an integer, got '2'", "gpus[5]: expected an integer, got 2.5"):
        assert needle in text, needle
    with pytest.raises(ConfigError) as err:
        parse_spec(train_spec(global_batch=24, micro_batches=[4, 8], gpus=[1, 5, 6, 8], gpus_per_node=2,
                              max_nodes=2), "t.yaml")
    text = str(err.value)
    assert "gpus: [5, 6, 8] cannot be spread evenly on at most 2 node(s) with at most gpus_per_node=2" in text
    with pytest.raises(ConfigError) as err:
        parse_spec(train_spec(global_batch=24, micro_batches=[4, 8], gpus=[1, 5, 6, 8]), "t.yaml")
    text = str(err.value)
    # 8 divides 24, but 3 samples a rank fit no micro batch; 5 does not divide it (parts of 5 and 4 samples,
    # micro batches of at most 4 fit) and 6 ranks x micro 4 x 1 = 24 fits.
    assert "gpus: 8 ranks compute 3 samples each a step, and no micro batch of [4, 8] divides 3" in text
    assert "gpus: 6 ranks" not in text and "gpus: 5 ranks" not in text and len(err.value.problems) == 1
    with pytest.raises(ConfigError) as err:
        parse_spec(train_spec(global_batch=24, micro_batches=[8, 24], gpus=[1, 5, 25]), "t.yaml")
    text = str(err.value)
    assert ("gpus: 5 ranks compute at most 5 samples each a step, and every micro batch of [8, 24] is larger; "
            "allowed: a micro batch of at most 5, or fewer ranks") in text
    assert "gpus: 25 ranks for global_batch 24 leave a rank without samples; allowed: at most 24 ranks" in text
    with pytest.raises(ConfigError) as err:
        parse_spec(train_spec(global_batch=32, micro_batches=[16], gpus=[1, 4]), "t.yaml")
    assert ("gpus: 4 ranks compute 8 samples each a step, and no micro batch of [16] divides 8; "
            "allowed: a micro batch dividing it (1, 2, 4, 8), or fewer ranks") in str(err.value)


def test_inference_gpus_need_a_replica_rule_and_get_their_knob():
    base = {"kind": "infer", "requests": 100, "gpu_memory_utilization": [0.9], "max_num_seqs": [8],
            "kv_cache_dtype": ["auto"], "mps_shares": [100], "gpus": [1, 2]}
    with pytest.raises(ConfigError, match="needs a replica rule: parallel: replicas .* allowed: replicas, tensor"):
        parse_spec(base, "i.yaml")
    with pytest.raises(ConfigError, match="parallel: 'pipeline' is not allowed; allowed: replicas, tensor"):
        parse_spec({**base, "parallel": "pipeline"}, "i.yaml")
    fam = parse_family({**base, "parallel": "replicas"}, "i.yaml", GPU)
    two = fam.shape("gmu0.9-seqs8-kvauto-dp2")
    one = fam.shape("gmu0.9-seqs8-kvauto-mps100")
    assert two.knob("replicas") == 2 and two.resources.gpus == 2
    assert two.throughput == pytest.approx(2 * one.throughput)  # replicas: the rate times n
    tp = parse_family({**base, "parallel": "tensor"}, "i.yaml", GPU).shape("gmu0.9-seqs8-kvauto-tp2")
    assert tp.knob("tensor_parallel_size") == 2 and one.throughput < tp.throughput < 2 * one.throughput


def test_mixed_error_kinds_come_together():
    with pytest.raises(ConfigError) as err:
        parse_spec(train_spec(gpus=[2, 4, 8], mps_shares=[50], global_batch=30, micro_batches=[5]), "t.yaml")
    text = str(err.value)
    assert "mps_shares: only a 1-GPU shape takes an MPS share" in text
    assert "gpus: 8 ranks compute at most 4 samples each a step, and every micro batch of [5] is larger" in text
    assert len(err.value.problems) == 2  # 2 ranks x micro 5 x 3 = 30 fits; 4 ranks take 8 or 7 samples: 5 + 3, 5 + 2


def test_estimate_scaling_rule_and_declared_override():
    one, mem1 = estimate.train({}, 64, 16, "fp32", False, 100)
    assert estimate.train({}, 64, 16, "fp32", False, 100, 1) == (one, mem1)
    two, mem2 = estimate.train({}, 64, 16, "fp32", False, 100, 2)
    slow_net, _ = estimate.train({"allreduce_gib_s": 0.01}, 64, 16, "fp32", False, 100, 2)
    assert mem2 == mem1 and one < two < 2 * one and slow_net < two
    fam = parse_family(train_spec(declared={"mb8-fp32-gpus2": {"throughput": 99.0}}), "t.yaml", GPU)
    assert fam.shape("mb8-fp32-gpus2").throughput == 99.0


@pytest.mark.parametrize("gpus,per_node,max_nodes,expected", [
    (4, 4, 0, (1, 4)), (8, 4, 0, (2, 4)), (6, 4, 0, (2, 3)), (5, 4, 0, (5, 1)), (5, 4, 2, None), (1, 1, 1, (1, 1))])
def test_layout_is_the_fewest_nodes_spread_evenly(gpus, per_node, max_nodes, expected):
    assert layout(gpus, per_node, max_nodes) == expected


def _node(name, gpus, partition="gpu", state="idle"):
    return NodeView(name, state, (partition,), 8, 0, 1000, 0, tuple(GpuView(name, i) for i in range(gpus)))


def test_partition_check_refuses_more_gpus_per_node_than_the_nodes_have():
    nodes = [_node("n1", 4), _node("n2", 4), _node("n3", 2, partition="other"), _node("n4", 8, state="down")]
    ok = parse_spec(train_spec(gpus=[1, 2, 4, 8], gpus_per_node=4), "t.yaml")
    assert partition_fit_problems(ok, nodes, "gpu") == []
    wide = parse_spec(train_spec(gpus=[1, 8], gpus_per_node=8), "t.yaml")
    problems = partition_fit_problems(wide, nodes, "gpu")
    assert problems[0] == ("gpus_per_node: 8 but the nodes of partition 'gpu' have at most 4 GPUs each; "
                           "allowed: gpus_per_node <= 4")
    assert len(problems) == 1  # 8 GPUs still fit as 2 x 4
    big = parse_spec(train_spec(global_batch=64, gpus=[1, 16], gpus_per_node=4), "t.yaml")
    assert "gpus: 16 GPUs cannot be spread evenly over the 2 usable node(s)" in partition_fit_problems(big, nodes, "gpu")[0]
    assert "has no usable node with a GPU" in partition_fit_problems(ok, nodes, "cpu")[0]
