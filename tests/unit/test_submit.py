"""elastico-submit's pure parts (sbatch argv, #SBATCH lines, added options, the generated script) and the command against a fake sbatch."""

from __future__ import annotations

import ast
import io
import json
import os
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from slurm_elastico.cli.submit import submit
from slurm_elastico.errors import ConfigError
from slurm_elastico.jobwrap.additions import added_options, signal_lead
from slurm_elastico.jobwrap.options import split_argv
from slurm_elastico.slurm.sbatch_options import Option, directive_options
from slurm_elastico.jobwrap.payload import Payload
from slurm_elastico.jobwrap.script import batch_script, payload_from_script, shebang_argv

FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 16, 32]
precisions: [fp32]
checkpointing: [false, true]
steps: 20
mps_shares: [25, 50]
default: mb8-fp32-mps25
"""
HOSTILE = ["it's \"q\"; $(touch x) `id` | ünï ✓\nsecond line", "--family", "-J", "", "a\\b", "#SBATCH --gres=gpu:4"]


def names(options) -> list[tuple[str, str | None]]:
    return [(o.name, o.value) for o in options]


# ----------------------------------------------------------------------------- argv splitting


def test_split_keeps_sbatch_options_verbatim_and_takes_family_out():
    args = split_argv(["-J", "my job", "--time", "10", "--family", "f.yaml", "-p", "debug", "--parsable",
                       "job.sh", "--family", "x", "-J"])
    assert args.sbatch_argv == ("-J", "my job", "--time", "10", "-p", "debug", "--parsable")
    assert args.family == "f.yaml"
    assert args.script == "job.sh"
    assert args.script_args == ("--family", "x", "-J")  # after the script everything is the script's
    assert names(args.options) == [("job-name", "my job"), ("time", "10"), ("partition", "debug"), ("parsable", None)]


def test_split_handles_getopt_forms():
    args = split_argv(["-HJname", "-vvv", "--req", "--family=f.yaml", "--gres=mps:10", "-t5", "--export", "job.sh"])
    assert names(args.options) == [("hold", None), ("job-name", "name"), ("verbose", None), ("verbose", None),
                                   ("verbose", None), ("requeue", None), ("gres", "mps:10"), ("time", "5"), ("export", None)]
    assert args.script == "job.sh" and args.family == "f.yaml"
    assert "--family=f.yaml" not in args.sbatch_argv


def test_split_double_dash_and_missing_values():
    assert split_argv(["--family", "f", "--", "-odd-name.sh", "a"]).script == "-odd-name.sh"
    assert split_argv(["--family", "f"]).script is None
    with pytest.raises(ConfigError, match="--time needs a value"):
        split_argv(["--time"])
    with pytest.raises(ConfigError, match="--family needs a file name"):
        split_argv(["--family"])


def test_directives_stop_at_the_first_command():
    text = "#!/bin/bash\n#SBATCH --requeue\n\n# a comment\n#SBATCH -J 'a b' # trailing\necho hi\n#SBATCH --gres=gpu:1\n"
    assert names(directive_options(text)) == [("requeue", None), ("job-name", "a b")]


# ----------------------------------------------------------------------------- options we add


def test_everything_added_when_the_user_chose_nothing():
    add = added_options((), {}, share=25, window_s=30, lead_s=120, job_name="train.py")
    assert add.argv == ("--requeue", "--open-mode=append", "--signal=B:USR1@120", "--gres=mps:25",
                        "--begin=now+30", "--job-name=train.py")


def test_the_users_choices_win_wherever_they_were_made():
    opts = [Option("no-requeue"), Option("open-mode", "truncate"), Option("signal", "USR2@60"), Option("gpus", "1"),
            Option("begin", "now+1hour"), Option("job-name", "mine")]
    add = added_options(opts, {}, share=25, window_s=30, lead_s=120, job_name="train.py")
    assert add.argv == ()
    assert any("--no-requeue" in n for n in add.notes) and any("GRES" in n for n in add.notes)
    via_env = added_options((), {"SBATCH_REQUEUE": "1", "SBATCH_GRES": "gpu:1"}, share=25, window_s=0, lead_s=0, job_name="")
    assert via_env.argv == ("--open-mode=append",)


def test_signal_lead_follows_the_users_signal_option():
    assert signal_lead([Option("signal", "B:USR1@300")], 120) == 300
    assert signal_lead([Option("signal", "USR1")], 120) == 120
    assert signal_lead([], 90) == 90


# ----------------------------------------------------------------------------- the generated script


def payload(script: bytes = b"#!/bin/sh\necho hi\n", args=("a",), family: str = FAMILY) -> Payload:
    return Payload(script=script, script_name="job.sh", args=tuple(args), family_spec=family, family_source="/x/f.yaml",
                   gpu_memory_mib=81920, grace_s=20.0, signal_lead_s=120)


def test_generated_script_is_our_python_and_the_users_header_only():
    user = "#!/bin/bash\n#SBATCH --time=5\n#SBATCH -J x\necho $(rm -rf /)\n"
    text = batch_script("/opt/py/bin/python3", user, payload(args=HOSTILE))
    lines = text.splitlines()
    assert lines[0] == "#!/opt/py/bin/python3"
    assert lines[2:4] == ["#SBATCH --time=5", "#SBATCH -J x"]
    assert "rm -rf" not in text and "$(" not in text and "it's" not in text  # user strings only inside base64
    tree = ast.parse(text)
    kinds = [type(node).__name__ for node in tree.body]
    assert kinds == ["Import", "Import", "Expr", "ImportFrom", "Assign", "Expr"]
    assert tree.body[3].module == "slurm_elastico.cli.run"
    assert isinstance(tree.body[4].value, ast.Constant) and set(tree.body[4].value.value) <= set(
        "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/=")


def test_generated_script_compiles_whatever_bytes_or_coding_words_the_header_holds():
    user = "#!/bin/bash\n#SBATCH --comment=coding:v2\n#SBATCH --job-name=caf\udce9\n"  # a lone latin-1 byte
    text = batch_script("/usr/bin/python3", user, payload())
    compile(text.encode("utf-8", "surrogateescape"), "batch", "exec")  # raises SyntaxError if it cannot run


@settings(max_examples=60, deadline=None)
@given(args=st.lists(st.text(), max_size=5), script=st.binary(max_size=200), family=st.text(max_size=200))
def test_payload_round_trips_exactly(args, script, family):
    p = payload(b"#!/bin/sh\n" + script, args, family)
    back = payload_from_script(batch_script("/usr/bin/python3", "#!/bin/sh\n", p))
    assert back == p


def test_interpreter_with_spaces_is_refused():
    with pytest.raises(ConfigError, match="no spaces"):
        batch_script("/my python/bin/python", "#!/bin/sh\n", payload())


def test_shebang_argv_runs_the_interpreter_like_the_kernel():
    assert shebang_argv(b"#!/usr/bin/env python3\nx", "/t/job") == ["/usr/bin/env", "python3", "/t/job"]
    assert shebang_argv(b"#!/bin/bash -l -e\n", "/t/job") == ["/bin/bash", "-l -e", "/t/job"]
    with pytest.raises(ConfigError, match="#!"):
        shebang_argv(b"echo hi\n", "/t/job")


# ----------------------------------------------------------------------------- the command, with a fake sbatch

FAKE_SBATCH = """#!{python}
import json, sys
args = sys.argv[1:]
script = sys.stdin.read()
with open({log!r}, "a") as f:
    f.write(json.dumps({{"argv": args, "script": script}}) + "\\n")
code = {code}
if code:
    print("sbatch: error: Batch job submission failed: Invalid partition name specified", file=sys.stderr)
    sys.exit(code)
print("42" if "--parsable" in args else "Submitted batch job 42")
"""


@pytest.fixture
def env(tmp_path: Path) -> dict[str, str]:
    (tmp_path / "elastico.yaml").write_text(f"state_dir: {tmp_path / 'state'}\nsubmit: {{placement_window_s: 7}}\n")
    (tmp_path / "fam.yaml").write_text(FAMILY)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n#SBATCH --time=5\n#SBATCH --comment='ünï ✓'\necho hi\n", encoding="utf-8")
    return {**os.environ, "ELASTICO_CONFIG": str(tmp_path / "elastico.yaml")}


def fake_sbatch(tmp_path: Path, code: int = 0) -> str:
    path = tmp_path / "sbatch"
    path.write_text(FAKE_SBATCH.format(python=sys.executable, log=str(tmp_path / "calls.jsonl"), code=code))
    path.chmod(0o755)
    return str(path)


def calls(tmp_path: Path) -> list[dict]:
    p = tmp_path / "calls.jsonl"
    return [json.loads(line) for line in p.read_text().splitlines()] if p.exists() else []


def state_files(tmp_path: Path) -> list[str]:
    """What elastico-submit left in the helper's state directory (it must write nothing there)."""
    state = tmp_path / "state"
    return sorted(p.name for p in state.iterdir()) if state.exists() else []


def run_submit(argv, env, tmp_path, code=0):
    out, err = io.StringIO(), io.StringIO()
    rc = submit(argv, env=env, out=out, err=err, sbatch=fake_sbatch(tmp_path, code), interpreter="/usr/bin/python3")
    return rc, out.getvalue(), err.getvalue()


def test_submit_passes_output_embeds_family_and_adds_only_what_is_missing(tmp_path, env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    rc, out, err = run_submit(["-p", "debug", "--requeue", "--family", "fam.yaml", "job.sh", *HOSTILE], env, tmp_path)
    assert (rc, out) == (0, "Submitted batch job 42\n"), err
    (call,) = calls(tmp_path)
    assert call["argv"] == ["--open-mode=append", "--signal=B:USR1@120", "--gres=mps:25", "--begin=now+7",
                            "--job-name=job.sh", "-p", "debug", "--requeue"]
    assert call["script"].splitlines()[2:4] == ["#SBATCH --time=5", "#SBATCH --comment='ünï ✓'"]
    p = payload_from_script(call["script"])
    assert p.args == tuple(HOSTILE) and p.script == (tmp_path / "job.sh").read_bytes() and p.family_spec == FAMILY
    assert state_files(tmp_path) == []  # the family travels in the batch script only: no helper state is written


def test_parsable_output_and_sbatch_exit_code_pass_through(tmp_path, env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert run_submit(["--parsable", "--family", "fam.yaml", "job.sh"], env, tmp_path)[:2] == (0, "42\n")
    rc, out, err = run_submit(["--family", "fam.yaml", "job.sh"], env, tmp_path, code=1)
    assert (rc, out) == (1, "")
    assert len(calls(tmp_path)) == 2 and state_files(tmp_path) == []


@pytest.mark.parametrize("code", [1, 0])
def test_an_sbatch_that_stops_reading_the_script_is_reported(tmp_path, env, monkeypatch, code):
    # 1 MiB of script is more than a pipe holds: the write breaks when sbatch exits without reading it.
    monkeypatch.chdir(tmp_path)
    (tmp_path / "job.sh").write_text("#!/bin/sh\n" + "# filler\n" * (1 << 17))
    quits = tmp_path / "quits"
    quits.write_text(f"#!/bin/sh\necho Submitted batch job 9\nexit {code}\n")
    quits.chmod(0o755)
    out, err = io.StringIO(), io.StringIO()
    rc = submit(["--family", "fam.yaml", "job.sh"], env=env, out=out, err=err, sbatch=str(quits))
    assert out.getvalue() == "Submitted batch job 9\n"
    if code:  # a refusal: sbatch's own exit code, as always
        assert rc == 1 and err.getvalue() == ""
    else:  # a success that cannot have seen the whole script is an error, not a silent pass
        assert rc == 3
        assert "elastico-submit: error: " in err.getvalue()
        assert "exited with 0 before it read the whole batch script" in err.getvalue()


def test_bad_family_and_missing_script_are_reported_together_and_nothing_is_submitted(tmp_path, env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "bad.yaml").write_text("kind: train\nglobal_batch: 30\nmicro_batches: [8]\nsteps: 0\nbogus: 1\n")
    rc, out, err = run_submit(["--family", "bad.yaml", "nope.sh"], env, tmp_path)
    assert rc == 2 and out == ""
    assert "nope.sh: cannot read it" in err and "bogus" in err and "nothing was submitted" in err
    assert calls(tmp_path) == [] and state_files(tmp_path) == []


@pytest.mark.parametrize("argv, message", [
    (["job.sh"], "--family FILE is required"),
    (["--family", "fam.yaml"], "no job script given"),
    (["--family", "fam.yaml", "--wrap=hostname", "job.sh"], "--wrap is not supported"),
    (["--family", "fam.yaml", "noshebang.sh"], "must start with #!"),
])
def test_usage_errors_submit_nothing(tmp_path, env, argv, message, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "noshebang.sh").write_text("echo hi\n")
    rc, _, err = run_submit(argv, env, tmp_path)
    assert rc == 2 and message in err and calls(tmp_path) == []


def test_help_prints_usage_without_sbatch(tmp_path, env, monkeypatch):
    rc, out, _ = run_submit(["--help"], env, tmp_path)
    assert rc == 0 and out.startswith("usage: elastico-submit") and calls(tmp_path) == []


def test_help_explains_the_family_file_with_an_example_that_is_valid():
    """The help is self-sufficient: it names the keys and gives an example that parses, and it sends the user to
    the documentation, never to a source file."""
    import yaml

    from slurm_elastico.cli.submit import USAGE
    from slurm_elastico.shapes.spec import parse_spec

    example = USAGE.split("Example:\n", 1)[1].split("\nFull reference:", 1)[0]
    spec = parse_spec(yaml.safe_load(example), "the help's example")
    assert spec.kind == "train" and spec.work == 1000
    for key in ("steps", "global_batch", "micro_batches", "precisions", "checkpointing", "requests",
                "gpu_memory_utilization", "max_num_seqs", "kv_cache_dtype", "mps_shares", "gpus", "gpus_per_node",
                "max_nodes", "parallel"):
        assert key in USAGE
    assert "docs/users/families.md" in USAGE and ".py" not in USAGE


def test_the_default_share_is_sent_in_slurms_counts_and_a_percent_that_is_no_whole_count_is_refused(
        tmp_path, env, monkeypatch):
    monkeypatch.chdir(tmp_path)
    conf = tmp_path / "elastico.yaml"
    conf.write_text(f"state_dir: {tmp_path / 'state'}\nsubmit: {{placement_window_s: 7}}\ngpu: {{shares_per_gpu: 48}}\n")
    assert run_submit(["--family", "fam.yaml", "job.sh"], env, tmp_path)[0] == 0
    assert "--gres=mps:12" in calls(tmp_path)[0]["argv"]  # the family's 25 % of a GPU of 48 shares
    conf.write_text(f"state_dir: {tmp_path / 'state'}\nsubmit: {{placement_window_s: 7}}\ngpu: {{shares_per_gpu: 50}}\n")
    rc, out, err = run_submit(["--family", "fam.yaml", "job.sh"], env, tmp_path)
    assert rc == 2 and "25 % is 12.5" in err and "shares_per_gpu=50" in err
    assert len(calls(tmp_path)) == 1  # nothing more was submitted


# ----------------------------------------------------------------------------- families with GPU counts

GPU_FAMILY = """kind: train
global_batch: 32
micro_batches: [8, 16]
precisions: [fp32]
checkpointing: [false]
steps: 20
gpus: [1, 2, 4]
gpus_per_node: 2
mps_shares: [100]
"""


def _prepared(tmp_path: Path, sbatch_args: list[str], nodes=None, shares_per_gpu: int = 100):
    from slurm_elastico import config
    from slurm_elastico.jobwrap.submit import prepare

    (tmp_path / "gpu.yaml").write_text(GPU_FAMILY)
    (tmp_path / "job.sh").write_text("#!/bin/sh\necho hi\n")
    settings = config.from_mapping({"gpu": {"shares_per_gpu": shares_per_gpu}})
    args = split_argv([*sbatch_args, "--family", str(tmp_path / "gpu.yaml"), str(tmp_path / "job.sh")])
    return prepare(args, settings, {}, sys.executable, nodes=nodes)


def _nodes(gpus_each: int, count: int, partition: str = "gpu"):
    from slurm_elastico.model import GpuView, NodeView

    return [NodeView(f"n{i}", "idle", (partition,), 8, 0, 1000, 0, tuple(GpuView(f"n{i}", g) for g in range(gpus_each)))
            for i in range(count)]


def test_a_family_with_gpu_counts_starts_on_whole_gpus_and_carries_the_sites_share_count(tmp_path):
    job = _prepared(tmp_path, ["-p", "gpu"], nodes=lambda: _nodes(2, 2), shares_per_gpu=4)
    # the default shape (the fastest: 4 ranks) at most 2 per node: 2 nodes x 2 GPUs
    assert "--gres=gpu:2" in job.additions and "--nodes=2" in job.additions
    assert not any(a.startswith("--gres=mps") for a in job.additions)
    assert payload_from_script(job.script).shares_per_gpu == 4


def test_a_family_whose_gpu_counts_do_not_fit_the_partition_is_refused_naming_it(tmp_path):
    with pytest.raises(ConfigError) as err:
        _prepared(tmp_path, ["-p", "gpu"], nodes=lambda: _nodes(1, 3))  # gpus_per_node 2 > 1; 4 GPUs on 3 nodes
    text = str(err.value)
    assert "gpus_per_node: 2" in text and "partition 'gpu'" in text and "allowed" in text


def test_without_a_partition_the_layout_is_not_checked_and_the_user_is_told(tmp_path):
    asked = []
    job = _prepared(tmp_path, [], nodes=lambda: asked.append(1) or _nodes(1, 1))
    assert asked == [] and any("no --partition" in n for n in job.notes)
