"""Offline inference runner: a reshaped (interrupted, new max_num_seqs) job gives exactly the uninterrupted outputs."""

from __future__ import annotations

import json
import sys
import types
from pathlib import Path

import pytest
import torch

from slurm_elastico.errors import ConfigError
from slurm_elastico.runtime.engines import Completion, EngineUnavailableError, TorchEngine, VllmEngine
from slurm_elastico.runtime.infer import run_inference
from slurm_elastico.runtime.journal import Journal, JournalCorruptError, read_requests
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, InferShape
from journal_helpers import journal_lines, outputs, stop_after

N = 23  # not a multiple of any batch size used below


@pytest.fixture(autouse=True)
def _one_thread():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def requests_file(tmp_path: Path) -> Path:
    path = tmp_path / "requests.jsonl"
    lines = [{"id": f"r{i:02d}", "prompt": f"question {i}: " + "why? " * (i % 4), "max_tokens": 3 + i % 6} for i in range(N)]
    path.write_text("".join(json.dumps(x) + "\n" for x in lines))
    return path


@pytest.fixture(scope="module", params=["torch", "transformers"])
def engine(request):
    """Each CPU engine; the transformers one only where the `cpu-infer` extra is installed."""
    if request.param == "torch":
        return TorchEngine(seed=0)
    pytest.importorskip("transformers", reason="transformers is not installed: install the 'cpu-infer' extra")
    from slurm_elastico.runtime.engines import TransformersEngine

    return TransformersEngine(seed=0)


def test_reshaped_run_equals_uninterrupted_run(tmp_path, requests_file, engine):
    ref = run_inference(requests_file, tmp_path / "ref.jsonl", engine, InferShape(max_num_seqs=4, name="a"))
    assert (ref.status, ref.done, ref.total, ref.exit_code) == ("done", N, N, 0)

    journal = tmp_path / "job.jsonl"
    first = run_inference(requests_file, journal, engine, InferShape(max_num_seqs=4), should_stop=stop_after(2))
    assert (first.status, first.written, first.exit_code) == ("checkpointed", 8, EXIT_CHECKPOINTED)
    second = run_inference(requests_file, journal, engine, InferShape(max_num_seqs=7), should_stop=stop_after(1))
    assert (second.status, second.written) == ("checkpointed", 7)
    third = run_inference(requests_file, journal, engine, InferShape(max_num_seqs=3))
    assert (third.status, third.done, third.written) == ("done", N, N - 15)

    ids = [r["id"] for r in journal_lines(journal)]
    assert len(ids) == len(set(ids)) == N  # each request exactly once
    assert outputs(journal) == outputs(tmp_path / "ref.jsonl")  # same greedy text and tokens
    assert all(len(tok) == 3 + int(i[1:]) % 6 for i, (_, tok) in outputs(journal).items())

    again = run_inference(requests_file, journal, engine, InferShape(max_num_seqs=5))
    assert again.written == 0 and len(journal_lines(journal)) == N  # a relaunch after completion writes nothing


def test_torn_last_line_is_dropped_and_redone(tmp_path, requests_file, engine):
    run_inference(requests_file, tmp_path / "ref.jsonl", engine, InferShape(max_num_seqs=5))
    journal = tmp_path / "job.jsonl"
    run_inference(requests_file, journal, engine, InferShape(max_num_seqs=5), should_stop=stop_after(1))
    data = journal.read_bytes()
    journal.write_bytes(data[: len(data) - 17])  # a kill mid-append: the last record loses its tail
    j = Journal(journal)
    assert len(j.done) == 4 and j.repaired_bytes > 0
    assert journal.read_bytes().endswith(b"\n")
    run_inference(requests_file, j, engine, InferShape(max_num_seqs=2))
    assert outputs(journal) == outputs(tmp_path / "ref.jsonl")
    assert len(journal_lines(journal)) == N


def test_garbage_before_the_end_is_not_silently_dropped(tmp_path):
    path = tmp_path / "j.jsonl"
    path.write_text('{"id": "a", "text": "x"}\nnot json\n{"id": "b", "text": "y"}\n')
    with pytest.raises(JournalCorruptError, match="not a torn append"):
        Journal(path)


def test_journal_refuses_to_write_a_request_twice(tmp_path):
    j = Journal(tmp_path / "j.jsonl")
    j.append([{"id": "a", "text": "x"}])
    with pytest.raises(JournalCorruptError, match="already journaled"):
        j.append([{"id": "a", "text": "x"}])
    assert len(Journal(tmp_path / "j.jsonl").done) == 1


def test_bad_requests_file_lists_every_problem(tmp_path):
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": "a", "prompt": "x", "max_tokens": 2}\n{"id": "a", "prompt": "y"}\nnope\n{"prompt": "z"}\n{"id": "c", "prompt": 1, "max_tokens": 0}\n')
    with pytest.raises(ConfigError) as err:
        read_requests(path)
    text = str(err.value)
    for expected in ("line 2: id 'a' repeats line 1", "line 3: not JSON", "line 4: 'id'", "line 5: 'prompt'", "line 5: 'max_tokens'"):
        assert expected in text


def test_vllm_missing_gives_a_clear_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", None)  # makes `import vllm` raise ImportError
    with pytest.raises(EngineUnavailableError, match="vLLM is not importable.*torch/transformers engine"):
        VllmEngine("some/model", InferShape(4))


def test_vllm_code_path_against_a_stand_in_module(monkeypatch):
    """Checks our calls (LLM(model, **engine_kwargs); greedy SamplingParams per request); not vLLM itself."""
    seen = {}

    class SamplingParams:
        def __init__(self, temperature, max_tokens):
            self.temperature, self.max_tokens = temperature, max_tokens

    class LLM:
        def __init__(self, model, **kwargs):
            seen["init"] = (model, kwargs)

        def generate(self, prompts, params, use_tqdm=True):
            seen["params"] = [(p.temperature, p.max_tokens) for p in params]
            out = types.SimpleNamespace
            return [out(outputs=[out(text=p.upper()[: s.max_tokens], token_ids=[1] * s.max_tokens)]) for p, s in zip(prompts, params)]

    monkeypatch.setitem(sys.modules, "vllm", types.SimpleNamespace(LLM=LLM, SamplingParams=SamplingParams))
    shape = InferShape(8, 0.4, "fp8", engine_args=(("max_model_len", 256),))
    eng = VllmEngine("tiny/model", shape)
    assert seen["init"] == ("tiny/model", {"max_num_seqs": 8, "gpu_memory_utilization": 0.4, "kv_cache_dtype": "fp8", "max_model_len": 256})
    assert eng.generate(["ab", "cde"], [1, 2]) == [Completion("A", (1,)), Completion("CD", (1, 1))]
    assert seen["params"] == [(0.0, 1), (0.0, 2)]


def test_transformers_engine_is_batch_size_invariant_on_these_prompts():
    pytest.importorskip("transformers", reason="transformers is not installed: install the 'cpu-infer' extra")
    from slurm_elastico.runtime.engines import TransformersEngine

    eng = TransformersEngine(seed=0)
    prompts = [f"p{i} " + "x" * i for i in range(6)]
    tokens = [2 + i % 3 for i in range(6)]
    whole = eng.generate(prompts, tokens)
    pieces = eng.generate(prompts[:2], tokens[:2]) + eng.generate(prompts[2:5], tokens[2:5]) + eng.generate(prompts[5:], tokens[5:])
    assert whole == pieces
    assert [len(c.token_ids) for c in whole] == tokens
    assert TransformersEngine(seed=0).generate(prompts[:1], [4]) == eng.generate(prompts[:1], [4])  # same weights each start


# --------------------------------------------------------------------------
# data-parallel replicas over the request list


def replica_env(replica: int, replicas: int) -> dict[str, str]:
    return {"RANK": str(replica), "WORLD_SIZE": str(replicas), "LOCAL_RANK": str(replica)}


def run_replicas(requests_file, journal, shape, stops):
    """One launch of `shape.replicas` replicas side by side (threads; each its own engine), replica r stopping per stops[r]."""
    from concurrent.futures import ThreadPoolExecutor

    engines = [TorchEngine(seed=0) for _ in range(shape.replicas)]  # built here: building seeds torch's global RNG, not thread-safe

    def one(r):
        return run_inference(requests_file, journal, engines[r], shape, should_stop=stops[r], env=replica_env(r, shape.replicas))

    with ThreadPoolExecutor(shape.replicas) as pool:
        return list(pool.map(one, range(shape.replicas)))


def all_shards(journal):
    from slurm_elastico.runtime.journal import journal_shards

    return {p.name: journal_lines(p) for p in journal_shards(journal)}


def test_moving_between_one_and_two_replicas_answers_each_request_once(tmp_path, requests_file):
    ref = tmp_path / "ref.jsonl"
    run_inference(requests_file, ref, TorchEngine(seed=0), InferShape(max_num_seqs=4))
    journal = tmp_path / "job.jsonl"
    never = lambda: False  # noqa: E731

    one = run_replicas(requests_file, journal, InferShape(4, replicas=1), [stop_after(1)])
    assert [(r.status, r.written) for r in one] == [("checkpointed", 4)]
    two = run_replicas(requests_file, journal, InferShape(3, replicas=2), [stop_after(2), stop_after(1)])
    assert [(r.status, r.written, r.replica) for r in two] == [("checkpointed", 6, 0), ("checkpointed", 3, 1)]
    shards = all_shards(journal)
    assert sorted(shards) == ["job.jsonl", "job.replica-1.jsonl"]
    # replica 1 answered only odd positions of the request file; replica 0 added even ones after the first launch's 4
    assert all(int(r["id"][1:]) % 2 == 1 for r in shards["job.replica-1.jsonl"])
    assert all(int(r["id"][1:]) % 2 == 0 for r in shards["job.jsonl"][4:])
    back = run_replicas(requests_file, journal, InferShape(5, replicas=1), [stop_after(1)])
    assert back[0].written == 5
    again = run_replicas(requests_file, journal, InferShape(2, replicas=2), [never, never])
    assert all(r.status == "done" for r in again) and sum(r.written for r in again) == N - 4 - 9 - 5
    assert max(r.done for r in again) == N  # the replica that ends last sees every shard complete

    ids = [rec["id"] for lines in all_shards(journal).values() for rec in lines]
    assert len(ids) == len(set(ids)) == N  # each request exactly once over all shards
    merged = {rec["id"]: (rec["text"], rec["token_ids"]) for lines in all_shards(journal).values() for rec in lines}
    assert merged == outputs(ref)  # the same greedy outputs as the uninterrupted single engine
    last = run_replicas(requests_file, journal, InferShape(4, replicas=1), [never])
    assert (last[0].status, last[0].written, last[0].done) == ("done", 0, N)  # a relaunch after completion writes nothing


def test_replica_count_must_match_world_size_and_shards_must_not_overlap(tmp_path, requests_file):
    with pytest.raises(ConfigError, match="WORLD_SIZE=2 but the shape has ELASTICO_REPLICAS=1"):
        run_inference(requests_file, tmp_path / "j.jsonl", TorchEngine(seed=0), InferShape(4), env=replica_env(0, 2))
    with pytest.raises(ConfigError, match="RANK=3 is not below WORLD_SIZE=2"):
        run_inference(requests_file, tmp_path / "j.jsonl", TorchEngine(seed=0), InferShape(4, replicas=2), env=replica_env(3, 2))
    assert not (tmp_path / "j.jsonl").exists()
    journal = tmp_path / "k.jsonl"
    run_inference(requests_file, journal, TorchEngine(seed=0), InferShape(4), should_stop=stop_after(1))
    (tmp_path / "k.replica-1.jsonl").write_bytes(journal.read_bytes().splitlines(keepends=True)[0])  # r00 twice
    with pytest.raises(JournalCorruptError, match="'r00' are journaled in another shard too"):
        run_inference(requests_file, journal, TorchEngine(seed=0), InferShape(4))


def test_another_replicas_torn_tail_is_left_to_it_and_its_request_redone(tmp_path, requests_file):
    journal = tmp_path / "j.jsonl"
    run_replicas(requests_file, journal, InferShape(2, replicas=2), [stop_after(0), stop_after(1)])
    shard = tmp_path / "j.replica-1.jsonl"
    torn = shard.read_bytes()[:-9]  # replica 1 killed mid-append: its second record (r03) lost its tail
    shard.write_bytes(torn)
    result = run_inference(requests_file, journal, TorchEngine(seed=0), InferShape(8))  # one replica now
    assert shard.read_bytes() == torn  # read-only: another replica's shard is never repaired by this one
    assert result.status == "done" and result.written == N - 1 and "r03" in Journal(journal).done
    assert Journal(shard).done.keys() == {"r01"}  # its own writer drops the torn tail when it opens it
