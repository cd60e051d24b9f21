"""The bad-input battery: every bad input to the real commands is a clear error, a non-zero exit, and nothing else.

Each case runs `elastico`, `elastico-submit` or `elastico-run` as a subprocess (a FIFO must not hang them: every
run has a timeout) and asserts: a non-zero exit; an error that names what is wrong (the case's own words) and what
is allowed; no traceback; nothing submitted (`sbatch` on PATH is a stub that records any call: what is checked here
is the commands' own logic, the real sbatch path is covered by the live tests); nothing half-written (the state
directory as it was: same files, sizes and times). A full disk is a file-size limit of 0 bytes (RLIMIT_FSIZE;
Python ignores SIGXFSZ, so a write fails with EFBIG as it would with ENOSPC).
"""

from __future__ import annotations

import os
import resource
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

ENTRY = {  # the console scripts' own entries, named as installed
    "elastico": "import sys; sys.argv[0] = 'elastico'; from slurm_elastico.cli import main; main()",
    "submit": "import sys; sys.argv[0] = 'elastico-submit'; from slurm_elastico.cli.submit import main; main()",
    "run": "import sys; sys.argv[0] = 'elastico-run'; from slurm_elastico.cli.run import main; main()",
}
TIMEOUT_S = 120
FAMILY = """kind: train
global_batch: 64
micro_batches: [16, 32]
precisions: [fp32]
checkpointing: [false]
steps: 100
mps_shares: [50, 100]
"""
HEADER = "job_id,submit_s,kind,app,gpus,work,global_batch,share,context_tokens,generated_tokens\n"
CLUSTER = f"badinput{uuid.uuid4().hex[:8]}"


def _family(**changes: str) -> str:
    lines = [ln for ln in FAMILY.splitlines() if ln.split(":")[0] not in changes]
    return "\n".join(lines + [f"{k}: {v}" for k, v in changes.items()]) + "\n"


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    d = tmp_path_factory.mktemp("bad")
    files = {
        "slurm.conf": f"ClusterName={CLUSTER}\n",
        "family.yaml": FAMILY,
        "job.sh": "#!/bin/sh\necho hello\n",
        "deep.yaml": "a: " + "[" * 5000 + "]" * 5000 + "\n",
        "bigint.yaml": "gpu:\n  memory_mib: " + "9" * 400 + "\n",
        "dup.yaml": "state_dir: /a\nstate_dir: /b\n",
        "alias.yaml": "a: &a [1, 1, 1, 1, 1, 1, 1, 1]\nb: &b [*a, *a, *a, *a, *a, *a, *a, *a]\nc: [*b, *b, *b, *b]\n",
        "unknown.yaml": "planner:\n  polcy: elastico\n",
        "nan.yaml": "planner:\n  step: .nan\n",
        "absurd.yaml": "gpu:\n  memory_mib: 1000000000000000\n",
        "policy.yaml": f"state_dir: {d}/state\nslurm:\n  conf: {d}/slurm.conf\nplanner:\n  policy: nosuch\n",
        "statefile.yaml": f"state_dir: {d}/statefile\nslurm:\n  conf: {d}/slurm.conf\n",
        "noconf.yaml": f"state_dir: {d}/state\nslurm:\n  conf: {d}/nosuch.conf\n",
        "statefull.yaml": f"state_dir: {d}/fresh/state\nslurm:\n  conf: {d}/slurm.conf\n",
        "good.yaml": f"state_dir: {d}/state\nslurm:\n  conf: {d}/slurm.conf\n",
        "statefile": "",
        "fam_dup.yaml": FAMILY + "steps: 5\n",
        "fam_deep.yaml": FAMILY + "model: " + "{a: " * 100 + "1" + "}" * 100 + "\n",
        "fam_bigint.yaml": _family(steps="1" + "0" * 400),
        "fam_cpus.yaml": _family(cpus="1000000000000"),
        "fam_cpus_float.yaml": _family(cpus="1e20"),
        "fam_name.yaml": _family(name="x" * 100000),
        "fam_list.yaml": _family(mps_shares="[" + ", ".join(["50"] * 10000) + "]"),
        "fam_hugelist.yaml": _family(mps_shares="[" + ", ".join(["50"] * 100000) + "]"),
        "fam_batch.yaml": _family(global_batch="1000000000000", micro_batches="[1, 2]"),
        "fam_shapes.yaml": _family(global_batch="1024", micro_batches="[1, 2, 4, 8, 16, 32, 64, 128]",
                                   precisions="[fp32, bf16, fp16]", checkpointing="[false, true]",
                                   mps_shares="[" + ", ".join(map(str, range(1, 101))) + "]"),
        "fam_batch_range.yaml": _family(batch="{adaptive: true, min: 256, max: 32}"),
        "fam_batch_infer.yaml": "kind: infer\nrequests: 10\ngpu_memory_utilization: [0.5]\nmax_num_seqs: [4]\n"
                                "kv_cache_dtype: [auto]\nmps_shares: [100]\nbatch: {adaptive: true, min: 1, max: 8}\n",
        "empty.csv": "",
        "header.csv": HEADER,
        "wide.csv": HEADER + "1,0,train,cifar10,64,4000,256,100,,\n",
        "short.csv": HEADER + "1,0\n",
        "sim_deep.yaml": "sim: " + "[" * 5000 + "]" * 5000 + "\n",
        "deep.json": "[" * 100000 + "]" * 100000,
    }
    for name, text in files.items():
        (d / name).write_text(text)
    for name in ("random.bin", "random.csv", "random.yaml"):
        (d / name).write_bytes(b"\xff\xfe\x00" + os.urandom(4000))
    (d / "big.yaml").write_text("# padding\n" * 200000)  # 2 MB of comments: valid YAML over the limit
    (d / "big.sh").write_text("#!/bin/sh\n" + "# padding\n" * 300000)
    for name in ("fifo", "fifo.csv", "fifo.yaml", "fifo.sh"):
        os.mkfifo(d / name)
    (d / "state").mkdir()
    (d / "state" / "keep.txt").write_text("the administrator's\n")
    bin_dir = d / "bin"
    bin_dir.mkdir()
    (bin_dir / "sbatch").write_text(f"#!/bin/sh\ncat >/dev/null\necho \"$@\" >> {d}/sbatch.calls\necho Submitted batch job 1\n")  # reads the script, as sbatch does
    (bin_dir / "sbatch").chmod(0o755)
    yield d
    for lock in (Path("/run/slurm-elastico") / f"{CLUSTER}.lock",):  # a full-disk case may leave its empty lock
        if lock.exists():
            lock.unlink()


# (id, command, arguments ({d} is the fixture's directory), words the error must hold, options)
CASES = [
    # settings (--config)
    ("config-fifo", "elastico", ["--config", "{d}/fifo", "config"], ["FIFO", "allowed: a regular file"], {}),
    ("config-device", "elastico", ["--config", "/dev/zero", "config"], ["character device", "allowed"], {}),
    ("config-random-bytes", "elastico", ["--config", "{d}/random.yaml", "config"], ["not UTF-8", "allowed"], {}),
    ("config-deep", "elastico", ["--config", "{d}/deep.yaml", "config"], ["nesting deeper than 32", "allowed"], {}),
    ("config-400-digits", "elastico", ["--config", "{d}/bigint.yaml", "config"], ["too large", "allowed: at most"], {}),
    ("config-duplicate-key", "elastico", ["--config", "{d}/dup.yaml", "config"],
     ["duplicate key 'state_dir'", "allowed: each key once"], {}),
    ("config-alias-bomb", "elastico", ["--config", "{d}/alias.yaml", "config"], ["alias *a", "allowed"], {}),
    ("config-huge-file", "elastico", ["--config", "{d}/big.yaml", "config"], ["larger than 1 MiB", "allowed"], {}),
    ("config-unknown-key", "elastico", ["--config", "{d}/unknown.yaml", "config"],
     ["planner.polcy: unknown key", "valid keys here"], {}),
    ("config-nan", "elastico", ["--config", "{d}/nan.yaml", "config"], ["planner.step", "expected float (finite)"], {}),
    ("config-absurd", "elastico", ["--config", "{d}/absurd.yaml", "config"], ["gpu.memory_mib", "above the maximum"],
     {}),
    ("config-unknown-policy", "elastico", ["--config", "{d}/policy.yaml", "config"],
     ["'nosuch' is not a policy", "allowed: elastico"], {}),
    ("option-repeated", "elastico", ["--config", "{d}/good.yaml", "--config", "{d}/good.yaml", "config"],
     ["--config given 2 times", "allowed: once"], {"usage": True}),
    # the helper
    ("sched-unknown-policy", "elastico", ["--config", "{d}/policy.yaml", "sched", "--once"],
     ["'nosuch' is not a policy", "allowed: elastico"], {}),
    ("sched-state-dir-is-a-file", "elastico", ["--config", "{d}/statefile.yaml", "sched", "--once"],
     ["state_dir:", "/statefile is a regular file", "allowed: a directory"], {"exit": 2}),
    ("sched-dry-run-state-dir-is-a-file", "elastico", ["--config", "{d}/statefile.yaml", "sched", "--once", "--dry-run"],
     ["state_dir:", "/statefile is a regular file", "allowed: a directory"], {"exit": 2}),
    ("config-state-dir-is-a-file", "elastico", ["--config", "{d}/statefile.yaml", "config"],
     ["state_dir:", "/statefile is a regular file", "allowed: a directory"], {"exit": 2}),
    ("status-slurm-conf-missing", "elastico", ["--config", "{d}/noconf.yaml", "status"],
     ["slurm.conf:", "/nosuch.conf does not exist", "allowed: the path of the cluster's slurm.conf"], {"exit": 2}),
    ("sched-full-disk", "elastico", ["--config", "{d}/statefull.yaml", "sched", "--once"],
     ["cannot write the lock", "allowed"], {"full": True, "exit": 74}),
    ("sched-dry-run-full-disk", "elastico", ["--config", "{d}/statefull.yaml", "sched", "--once", "--dry-run"],
     ["cannot open the store", "allowed"], {"full": True, "exit": 74, "absent": "fresh/state/elastico.sqlite"}),
    ("sched-families-fifo", "elastico", ["--config", "{d}/good.yaml", "sched", "--once", "--dry-run", "--families",
                                         "{d}/fifo"], ["is not a directory", "allowed"], {}),
    # the simulator
    ("sim-trace-fifo", "elastico", ["sim", "run", "--trace", "{d}/fifo.csv"], ["FIFO", "allowed"], {}),
    ("sim-trace-random-bytes", "elastico", ["sim", "run", "--trace", "{d}/random.csv"], ["not UTF-8", "allowed"], {}),
    ("sim-trace-empty", "elastico", ["sim", "run", "--trace", "{d}/empty.csv"], ["no jobs", "allowed"], {}),
    ("sim-trace-header-only", "elastico", ["sim", "run", "--trace", "{d}/header.csv"], ["no jobs", "allowed"], {}),
    ("sim-trace-short-row", "elastico", ["sim", "run", "--trace", "{d}/short.csv"], ["row 2", "the format is"], {}),
    ("sim-job-wider-than-cluster", "elastico", ["sim", "run", "--trace", "{d}/wide.csv", "--gpus", "4"],
     ["asks for 64 GPUs; the cluster has 4", "allowed"], {}),
    ("sim-pollux-no-such-workload", "elastico", ["sim", "run", "--trace", "pollux:9"],
     ["no such bundled workload", "allowed: pollux:N with N in 1..8"], {}),
    ("sim-pollux-wrong-columns", "elastico", ["sim", "run", "--trace", "pollux:{d}/wide.csv"],
     ["missing column(s) time, application", "allowed"], {}),
    ("sim-philly-wrong-columns", "elastico", ["sim", "run", "--trace", "philly:{d}/wide.csv"],
     ["missing column(s) duration_s, num_gpus", "allowed"], {}),
    ("sim-alibaba-fifo", "elastico", ["sim", "run", "--trace", "alibaba:{d}/fifo.csv"], ["FIFO", "allowed"], {}),
    ("sim-unknown-policy", "elastico", ["sim", "run", "--policy", "nosuch"], ["not a policy", "allowed"], {}),
    ("sim-compare-unknown-policy", "elastico", ["sim", "compare", "--policies", "elastico,nosuch"],
     ["'nosuch' is not a policy", "allowed"], {}),
    ("sim-loads-not-numbers", "elastico", ["sim", "compare", "--loads", "1,two"], ["'two' is not a load", "allowed"],
     {"usage": True}),
    ("sim-load-nan", "elastico", ["sim", "run", "--load", "nan"], ["not a finite number", "allowed"], {"usage": True}),
    ("sim-jobs-absurd", "elastico", ["sim", "run", "--jobs", "1000000000"], ["--jobs", "1<=x<=100000"],
     {"usage": True}),
    ("sim-config-deep", "elastico", ["sim", "run", "--trace", "pollux:1", "--sim-config", "{d}/sim_deep.yaml"],
     ["nesting deeper than 32", "allowed"], {}),
    ("sim-config-fifo", "elastico", ["sim", "run", "--trace", "pollux:1", "--sim-config", "{d}/fifo.yaml"],
     ["FIFO", "allowed"], {}),
    ("sim-option-repeated", "elastico", ["sim", "run", "--policy", "static", "--policy", "elastico"],
     ["--policy given 2 times", "allowed: once"], {"usage": True}),
    # interference data
    ("iac-data-fifo", "elastico", ["iac", "evaluate", "--data", "{d}/fifo.csv", "--split", "kfold"],
     ["FIFO", "allowed"], {}),
    ("iac-data-random-bytes", "elastico", ["iac", "evaluate", "--data", "{d}/random.csv", "--split", "kfold"],
     ["not UTF-8", "allowed"], {}),
    ("iac-model-fifo", "elastico", ["iac", "evaluate", "--data", "{d}/header.csv", "--model", "{d}/fifo"],
     ["FIFO", "allowed"], {}),
    ("iac-gavel-json-deep", "elastico", ["iac", "import-gavel", "--json", "{d}/deep.json", "--out", "{d}/x.csv"],
     ["nested too deep", "allowed"], {}),
    # elastico-submit
    ("submit-family-fifo", "submit", ["--family", "{d}/fifo.yaml", "{d}/job.sh"], ["FIFO", "allowed"], {}),
    ("submit-script-fifo", "submit", ["--family", "{d}/family.yaml", "{d}/fifo.sh"], ["job script", "FIFO"], {}),
    ("submit-script-directory", "submit", ["--family", "{d}/family.yaml", "{d}"], ["job script", "a directory"], {}),
    ("submit-script-huge", "submit", ["--family", "{d}/family.yaml", "{d}/big.sh"], ["larger than 2 MiB", "allowed"],
     {}),
    ("submit-script-random-bytes", "submit", ["--family", "{d}/family.yaml", "{d}/random.bin"],
     ["first line must start with #!"], {}),
    ("submit-family-random-bytes", "submit", ["--family", "{d}/random.yaml", "{d}/job.sh"], ["not UTF-8", "allowed"],
     {}),
    ("submit-family-duplicate-key", "submit", ["--family", "{d}/fam_dup.yaml", "{d}/job.sh"],
     ["duplicate key 'steps'", "allowed: each key once"], {}),
    ("submit-family-deep", "submit", ["--family", "{d}/fam_deep.yaml", "{d}/job.sh"], ["nesting deeper", "allowed"],
     {}),
    ("submit-family-400-digits", "submit", ["--family", "{d}/fam_bigint.yaml", "{d}/job.sh"],
     ["too large", "allowed"], {}),
    ("submit-family-absurd-cpus", "submit", ["--family", "{d}/fam_cpus.yaml", "{d}/job.sh"],
     ["cpus: 1000000000000 is out of range", "allowed: between 1 and 4096"], {}),
    ("submit-family-cpus-1e20", "submit", ["--family", "{d}/fam_cpus_float.yaml", "{d}/job.sh"],
     ["cpus: expected an integer", "'1e20'"], {}),
    ("submit-family-huge-name", "submit", ["--family", "{d}/fam_name.yaml", "{d}/job.sh"],
     ["name: 100000 characters", "allowed: at most 128"], {}),
    ("submit-family-long-list", "submit", ["--family", "{d}/fam_list.yaml", "{d}/job.sh"],
     ["mps_shares: 10000 choices", "allowed: at most 128"], {"short": True}),
    ("submit-family-100000-list", "submit", ["--family", "{d}/fam_hugelist.yaml", "{d}/job.sh"],
     ["larger than 256 KiB", "allowed"], {"short": True}),
    ("submit-family-absurd-batch", "submit", ["--family", "{d}/fam_batch.yaml", "{d}/job.sh"],
     ["global_batch: 1000000000000 is out of range", "allowed: between 1 and 1048576"], {}),
    ("submit-family-batch-min-above-max", "submit", ["--family", "{d}/fam_batch_range.yaml", "{d}/job.sh"],
     ["batch.min: 256 is above batch.max 32", "allowed: min <= max"], {}),
    ("submit-family-adaptive-inference", "submit", ["--family", "{d}/fam_batch_infer.yaml", "{d}/job.sh"],
     ["batch: only a training family may adapt its batch", "allowed: drop the batch key"], {}),
    ("submit-family-too-many-shapes", "submit", ["--family", "{d}/fam_shapes.yaml", "{d}/job.sh"],
     ["make 4800 shapes", "allowed: at most 4096"], {}),
    ("submit-family-twice", "submit", ["--family", "{d}/family.yaml", "--family", "{d}/family.yaml", "{d}/job.sh"],
     ["--family given more than once", "allowed"], {}),
    # elastico-run
    ("run-family-fifo", "run", ["--family", "{d}/fifo.yaml", "--", "true"], ["FIFO", "allowed"], {}),
]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(root)): (p.stat().st_size, p.stat().st_mtime_ns) for p in sorted(root.rglob("*"))
            if p.is_file()}


def _full_disk() -> None:
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, 0))


@pytest.mark.parametrize("name, tool, args, words, opts", CASES, ids=[c[0] for c in CASES])
def test_bad_input_is_a_clear_error_and_nothing_else(world, name, tool, args, words, opts):
    d = world
    argv = [sys.executable, "-c", ENTRY[tool], *(a.format(d=d) for a in args)]
    env = {**os.environ, "PATH": f"{d}/bin:{os.environ.get('PATH', '')}", "ELASTICO_CONFIG": f"{d}/good.yaml",
           "PYTHONDONTWRITEBYTECODE": "1", "HOME": str(d)}
    before = _snapshot(d / "state")
    try:
        res = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=d, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL,
                             preexec_fn=_full_disk if opts.get("full") else None)
    except subprocess.TimeoutExpired:
        pytest.fail(f"{name}: hung for {TIMEOUT_S} s")
    err = res.stderr
    assert res.returncode != 0, f"{name}: accepted (exit 0)\n{res.stdout[-2000:]}{err[-2000:]}"
    if "exit" in opts:
        assert res.returncode == opts["exit"], err
    assert "Traceback" not in err + res.stdout, f"{name}: traceback\n{err[-3000:]}"
    for word in words:
        assert word in err, f"{name}: {word!r} not in the error:\n{err[-3000:]}"
    marker = "Error:" if opts.get("usage") else "error:"
    assert marker in err
    assert not (d / "sbatch.calls").exists(), f"{name}: sbatch was called"
    assert _snapshot(d / "state") == before, f"{name}: the state directory changed"
    if opts.get("short"):
        assert len(err) < 2000, f"{name}: a {len(err)}-character error"
    if "absent" in opts:
        assert not (d / opts["absent"]).exists()
    if opts.get("full"):
        made = d / "fresh" / "state"
        assert not made.exists() or [p for p in made.rglob("*") if p.is_file() and p.stat().st_size] == [], \
            "a full disk left a written file in the state directory"


def test_the_battery_can_fail(world):
    """The harness sees a success: the good family and script are submitted (to the stub) with exit 0."""
    d = world
    env = {**os.environ, "PATH": f"{d}/bin:{os.environ.get('PATH', '')}", "ELASTICO_CONFIG": f"{d}/good.yaml"}
    calls = d / "sbatch.calls"
    try:
        res = subprocess.run([sys.executable, "-c", ENTRY["submit"], "--family", f"{d}/family.yaml", f"{d}/job.sh"],
                             capture_output=True, text=True, env=env, timeout=TIMEOUT_S)
        assert res.returncode == 0, res.stderr
        assert calls.exists() and "Submitted batch job 1" in res.stdout
    finally:
        calls.unlink(missing_ok=True)


def _in_small_mount(d: Path, options: str, fill: bool, args: list[str]) -> subprocess.CompletedProcess:
    """Run `elastico ARGS` in a private mount namespace where `d/mnt` is a 64 KiB tmpfs holding `state/`,
    remounted read-only (`options` "ro") or filled to the last byte (`fill`): a real read-only or full disk."""
    mnt = d / "mnt"
    mnt.mkdir(exist_ok=True)
    setup = [f"mount -t tmpfs -o size=64k tmpfs {mnt}", f"mkdir -m 700 {mnt}/state"]
    if fill:
        setup.append(f"(dd if=/dev/zero of={mnt}/fill bs=4k 2>/dev/null || true)")
    if options == "ro":
        setup.append(f"mount -o remount,ro {mnt}")
    script = " && ".join(setup) + ' && "$@"; rc=$?; find "$0" -type f -size +0 -path "*/state/*"; exit $rc'
    argv = ["unshare", "-m", "sh", "-c", script, str(mnt), sys.executable, "-c", ENTRY["elastico"], *args]
    return subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_S, stdin=subprocess.DEVNULL)


def _private_mounts() -> str:
    """Why a private mount namespace cannot be made here ("" when it can): the disk tests need one."""
    if os.geteuid() != 0:
        return "needs root for a private tmpfs mount"
    try:
        res = subprocess.run(["unshare", "-m", "true"], capture_output=True, text=True, timeout=30)
    except FileNotFoundError:
        return "needs unshare(1) for a private tmpfs mount"
    return "" if res.returncode == 0 else f"unshare -m fails here (in a chroot, say): {res.stderr.strip()}"


NO_PRIVATE_MOUNTS = _private_mounts()
"""Why the disk tests cannot run here ("": they can): a missing capability of the host, named in the skip."""


@pytest.mark.skipif(bool(NO_PRIVATE_MOUNTS), reason=NO_PRIVATE_MOUNTS or "-")
@pytest.mark.parametrize("disk", ["read-only", "full"])
@pytest.mark.parametrize("dry_run", [False, True], ids=["acting", "dry-run"])
def test_sched_on_a_read_only_or_full_disk_starts_nothing(world, disk, dry_run):
    d = world
    conf = d / f"mnt-{disk}.yaml"
    conf.write_text(f"state_dir: {d}/mnt/state\nslurm:\n  conf: {d}/slurm.conf\n")
    res = _in_small_mount(d, "ro" if disk == "read-only" else "rw", disk == "full",
                          ["--config", str(conf), "sched", "--once", *(["--dry-run"] if dry_run else [])])
    assert res.returncode not in (0, 1), res.stderr  # 1 would be an unhandled exception
    assert "Traceback" not in res.stderr
    assert "allowed" in res.stderr and ("Read-only" in res.stderr or "readonly" in res.stderr
                                        or "full" in res.stderr or "No space" in res.stderr
                                        or "unable to open" in res.stderr), res.stderr
    assert res.stdout.strip() == "", f"the state directory holds written files: {res.stdout}"
