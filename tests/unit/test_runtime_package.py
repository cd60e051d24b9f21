"""The runtime package's lazily provided names import in a fresh process, and unknown names are plain AttributeErrors."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import slurm_elastico.runtime as runtime

REPO = Path(__file__).resolve().parents[2]

# A new process: in this one another test may already have imported the checkpoint module,
# which hides the recursion a first `from slurm_elastico.runtime import save_checkpoint` fell into.
CHILD = """
import slurm_elastico.runtime as runtime
from slurm_elastico.runtime import {names}
assert hasattr(runtime, "no_such_name") is False
print("ok")
"""


def test_lazy_names_import_in_a_new_process_and_unknown_names_are_absent():
    names = ", ".join(sorted(runtime._LAZY))
    proc = subprocess.run(
        [sys.executable, "-c", CHILD.format(names=names)], cwd=REPO, capture_output=True, text=True, timeout=120
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert proc.stdout.strip() == "ok"


def test_every_lazy_name_is_exported():
    assert runtime._LAZY <= set(runtime.__all__)


def test_the_inference_runner_still_provides_its_engines():
    # Programs written to the first users' guide import the engines beside the runner.
    from slurm_elastico.runtime import engines, infer
    from slurm_elastico.runtime.infer import TorchEngine, TransformersEngine, VllmEngine, run_inference

    assert (VllmEngine, TorchEngine, TransformersEngine) == (engines.VllmEngine, engines.TorchEngine,
                                                             engines.TransformersEngine)
    assert callable(run_inference) and set(infer.__all__) >= {"VllmEngine", "run_inference"}
