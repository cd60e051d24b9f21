"""The real vLLM path (`VllmEngine`: `vllm.LLM(...).generate`) on a CPU with the vllm-cpu build and a tiny local model.

Runs only where vLLM is importable (`make test-vllm-cpu` makes such a venv);
about a minute: each engine start costs seconds. Proves that greedy vLLM
output is transformers' greedy output for the same weights, and that a job
interrupted and relaunched at other `max_num_seqs` (in this process and as
the example job's own process, stopped by SIGUSR1) journals exactly the
uninterrupted run's outputs: same ids, each once, same text and token ids.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("vllm", reason="vLLM is not installed: run `make test-vllm-cpu`")

from slurm_elastico.runtime.engines import VllmEngine  # noqa: E402
from slurm_elastico.runtime.infer import run_inference  # noqa: E402
from slurm_elastico.runtime.journal import read_requests  # noqa: E402
from slurm_elastico.runtime.shape import EXIT_CHECKPOINTED, InferShape  # noqa: E402
from slurm_elastico.runtime.tinyhf import build_tiny_model_dir  # noqa: E402
from journal_helpers import journal_lines, outputs, stop_after

EXAMPLES = Path(__file__).resolve().parents[2] / "wrappers" / "examples"
REQUESTS = EXAMPLES / "requests.jsonl"
# Small CPU settings; float32 so vLLM and transformers compute the same greedy tokens.
ENGINE_ARGS = (("dtype", "float32"), ("enforce_eager", True), ("max_model_len", 128))
VLLM_ENV = {
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB of KV cache; the default takes a large share of RAM
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",  # engine core in this process: no spawn of the pytest process
}


def shape(max_num_seqs: int) -> InferShape:
    return InferShape(max_num_seqs=max_num_seqs, name=f"seqs{max_num_seqs}", engine_args=ENGINE_ARGS)


@pytest.fixture(scope="module", autouse=True)
def _vllm_env():
    with pytest.MonkeyPatch.context() as mp:
        for key, value in VLLM_ENV.items():
            mp.setenv(key, value)
        yield


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> Path:
    return build_tiny_model_dir(tmp_path_factory.mktemp("tiny-llama"), seed=0)


@pytest.fixture(scope="module")
def engine4(model_dir) -> VllmEngine:
    return VllmEngine(str(model_dir), shape(4))


def test_vllm_greedy_equals_transformers_greedy(tmp_path, model_dir, engine4):
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    run_inference(REQUESTS, tmp_path / "vllm.jsonl", engine4, shape(4))
    got = outputs(tmp_path / "vllm.jsonl")
    tok = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    for r in read_requests(REQUESTS):
        ids = tok(r.prompt, return_tensors="pt").input_ids
        with torch.no_grad():
            want = model.generate(ids, max_new_tokens=r.max_tokens, do_sample=False)[0, ids.shape[1] :].tolist()
        assert got[r.id][1] == want, r.id
    assert len({text for text, _ in got.values()}) > 1  # the prompts matter: not one constant output


def test_reshaped_vllm_job_equals_uninterrupted_run(tmp_path, model_dir, engine4):
    n = len(read_requests(REQUESTS))
    ref = run_inference(REQUESTS, tmp_path / "ref.jsonl", engine4, shape(4))
    assert (ref.status, ref.done) == ("done", n)

    job = tmp_path / "job.jsonl"
    first = run_inference(REQUESTS, job, engine4, shape(4), should_stop=stop_after(2))
    assert (first.status, first.done, first.exit_code) == ("checkpointed", 8, EXIT_CHECKPOINTED)

    # Relaunch as the example job's own process at 5 seqs, with vLLM's default engine-core process; SIGUSR1 after one batch.
    env = {**os.environ, **VLLM_ENV, **shape(5).to_env(), "ELASTICO_CKPT_DIR": str(tmp_path)}
    env.pop("VLLM_ENABLE_V1_MULTIPROCESSING")
    proc = subprocess.Popen(
        [sys.executable, str(EXAMPLES / "infer_tiny.py"), "--engine", "vllm", "--model", str(model_dir), "--journal", str(job), "--batch-sleep", "1"],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )
    assert proc.stdout is not None
    lines = []
    for line in proc.stdout:
        lines.append(line)
        if line.startswith("journaled "):
            proc.send_signal(signal.SIGUSR1)
            break
    lines += proc.stdout.readlines()
    assert proc.wait(timeout=120) == EXIT_CHECKPOINTED, "".join(lines)
    summary = json.loads([x for x in lines if x.startswith("{")][-1])
    assert (summary["status"], summary["done"], summary["written"], summary["requested_by"]) == ("checkpointed", 13, 5, "SIGUSR1")

    # Relaunch in this process at 3 seqs: a new engine, to the end.
    last = run_inference(REQUESTS, job, VllmEngine(str(model_dir), shape(3)), shape(3))
    assert (last.status, last.done, last.written) == ("done", n, n - 13)

    records = journal_lines(job)
    assert sorted(r["id"] for r in records) == sorted(outputs(tmp_path / "ref.jsonl"))  # every id, each once
    assert {r["shape"] for r in records} == {"seqs4", "seqs5", "seqs3"}
    assert outputs(job) == outputs(tmp_path / "ref.jsonl")
