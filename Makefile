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

# The live Slurm tests against the other Slurm version Debian ships (12 <-> 13), in a cached chroot (root).
.PHONY: test-other-slurm
test-other-slurm:
	etc/dev/other-slurm

demo: setup
	$(VENV)/bin/elastico demo

clean:
	-$(VENV)/bin/elastico cluster down
	rm -rf $(VENV)
