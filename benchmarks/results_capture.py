"""Capturing benchmark results: run each benchmark, keep its final JSON line with where and how it was measured.

A captured result is docs/results/<name>.json: {"benchmark", "provenance",
"figures"} when the benchmark ended with a line of JSON, or {"benchmark",
"provenance", "error"} when it failed or its last line was not JSON; a
failure is kept (and shown on the results page) rather than dropped, and the
run still ends non-zero naming it. Provenance is read once, before the first
benchmark runs, so the results' own files do not mark the tree dirty.
"""

from __future__ import annotations

import datetime
import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from slurm_elastico.jsonout import finite

ROOT = Path(__file__).resolve().parent.parent
BENCHMARKS = ("sim", "planner", "interference", "online", "checkpoint", "reshape", "type_prior", "whatif",
              "helper_scale", "from_sacct_scale")
"""Every benchmark in benchmarks/, in the order of the results page (the headline's first)."""
ERROR_TAIL_LINES = 20


class CaptureError(RuntimeError):
    """Some benchmark failed or did not end with a line of JSON (its result file holds the error)."""


def git_commit(root: Path = ROOT) -> str:
    """The checked-out commit (12 hex digits), with `-dirty` when tracked files differ from it (untracked ignored)."""
    head = subprocess.run(["git", "rev-parse", "--short=12", "HEAD"], cwd=root, capture_output=True, text=True,
                          timeout=30, check=True).stdout.strip()
    changed = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root,
                             capture_output=True, text=True, timeout=30, check=True).stdout.strip()
    return head + ("-dirty" if changed else "")


def _first(path: str, key: str, sep: str) -> str:
    """The value of the first `key<sep>value` line of a text file; "" when the file or key is missing."""
    try:
        lines = Path(path).read_text().splitlines()
    except OSError:
        return ""
    for line in lines:
        k, found, v = line.partition(sep)
        if found and k.strip() == key:
            return v.strip().strip('"')
    return ""


def _version(package: str) -> str:
    try:
        return importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        return ""


def machine() -> dict:
    """What the figures were measured on: CPU model and count, memory, OS, Python and torch, the load at start."""
    mem_kib = _first("/proc/meminfo", "MemTotal", ":").split()
    return {"cpu": _first("/proc/cpuinfo", "model name", ":") or platform.processor() or platform.machine(),
            "cpus": os.cpu_count(), "memory_gib": round(int(mem_kib[0]) / 2**20, 1) if mem_kib else None,
            "os": _first("/etc/os-release", "PRETTY_NAME", "=") or platform.system(),
            "python": platform.python_version(), "torch": _version("torch"),
            "load_avg_1m": round(os.getloadavg()[0], 2)}


def provenance(full: bool) -> dict:
    """Commit, date (UTC), machine and mode, shared by the benchmarks of one capture."""
    return {"commit": git_commit(), "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
            "mode": "full" if full else "quick", "machine": machine()}


def command(name: str, full: bool) -> list[str]:
    """The argv that runs benchmark `name` from the repository root, as a reader would type it."""
    return [".venv/bin/python", f"benchmarks/{name}.py", *([] if full else ["--quick"])]


def last_json(stdout: str) -> dict:
    """The figures on the last non-empty line of a benchmark's output; ValueError saying what is there instead."""
    lines = [line for line in stdout.splitlines() if line.strip()]
    if not lines:
        raise ValueError("it printed nothing")
    try:
        figures = json.loads(lines[-1])
    except json.JSONDecodeError as e:
        raise ValueError(f"its last line is not JSON ({e}): {lines[-1][:200]!r}") from None
    if not isinstance(figures, dict):
        raise ValueError(f"its last line is JSON but not an object: {lines[-1][:200]!r}")
    return figures


def local_paths_out(text: str, root: Path = ROOT) -> str:
    """`text` with this checkout's and the temporary directory's paths made generic: an error kept in the
    repository names files as a reader's checkout has them."""
    return text.replace(f"{root}{os.sep}", "").replace(str(root), ".").replace(tempfile.gettempdir(), "$TMPDIR")


def run_one(name: str, full: bool, prov: dict, root: Path = ROOT) -> dict:
    """Run one benchmark, echoing its output as it comes; its result record (figures, or the error)."""
    argv = command(name, full)
    exe = [sys.executable, *argv[1:]]  # this interpreter: the project's environment, wherever it lives
    print(f"== {' '.join(argv)}", flush=True)
    record = {"benchmark": name, "command": " ".join(argv),
              "provenance": {**prov, "machine": {**prov["machine"], "load_avg_1m": round(os.getloadavg()[0], 2)}}}
    t0 = time.monotonic()
    with tempfile.TemporaryFile(mode="w+") as err:
        proc = subprocess.Popen(exe, cwd=root, stdout=subprocess.PIPE, stderr=err, text=True)
        out = []
        for line in proc.stdout:
            print(line, end="", flush=True)
            out.append(line)
        rc = proc.wait()
        err.seek(0)
        stderr = err.read()
    record["wall_s"] = round(time.monotonic() - t0, 1)
    if rc != 0:
        tail = local_paths_out("\n".join(stderr.strip().splitlines()[-ERROR_TAIL_LINES:]), root)
        record["error"] = f"exit status {rc}" + (f"; the end of its error output:\n{tail}" if tail else "")
        return record
    try:
        record["figures"] = finite(last_json("".join(out)))
    except ValueError as e:
        record["error"] = local_paths_out(str(e), root)
    return record


def capture(names, full: bool, out_dir: Path) -> list[str]:
    """Run the benchmarks `names` and write each one's record to `out_dir`/<name>.json; the names that failed."""
    prov = provenance(full)
    out_dir.mkdir(parents=True, exist_ok=True)
    failed = []
    for name in names:
        record = run_one(name, full, prov)
        (out_dir / f"{name}.json").write_text(json.dumps(record, indent=1, allow_nan=False) + "\n")
        if "error" in record:
            failed.append(name)
            print(f"results: benchmarks/{name}.py FAILED: {record['error']}", file=sys.stderr, flush=True)
    return failed
