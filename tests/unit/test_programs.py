"""Hints name this installation's scripts so that they run as printed (cluster.programs), with real scripts."""

import os
import subprocess
import sys
from pathlib import Path

from slurm_elastico.cluster.programs import program, typed


def test_program_is_the_script_beside_the_interpreter():
    assert program("elastico") == Path(sys.executable).parent / "elastico"
    assert program("elastico").exists(), "the test environment installs the console scripts"


def test_off_path_the_hint_is_the_scripts_path_and_runs_as_printed(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", "/usr/bin:/bin")  # the venv's bin is not on it, as after `make setup`
    venv_parent = Path(sys.executable).parent.parent.parent
    monkeypatch.chdir(venv_parent)
    hint = typed("elastico")
    assert hint == os.path.relpath(program("elastico"), venv_parent) and not os.path.isabs(hint)
    done = subprocess.run(["/bin/sh", "-c", f"{hint} cluster --help"], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0 and "up" in done.stdout
    monkeypatch.chdir(tmp_path)  # elsewhere: the absolute path
    assert typed("elastico") == str(Path(os.path.abspath(program("elastico"))))


def test_on_path_the_hint_is_the_bare_name(monkeypatch):
    monkeypatch.setenv("PATH", f"{program('elastico').parent}{os.pathsep}/usr/bin:/bin")
    assert typed("elastico") == "elastico"
