# Two entry points, both working from a clean clone: `make demo` and `make test`.
# The CPU torch wheel is installed first and explicitly, so that no multi-GB CUDA build is pulled.
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TORCH_SPEC ?= torch==2.13.0

.PHONY: demo test setup bench clean

$(VENV)/.installed: setup.cfg setup.py
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q "$(TORCH_SPEC)"
	$(PY) -m pip install -q -e ".[dev]"
	touch $@

setup: $(VENV)/.installed

demo: setup
	OMP_NUM_THREADS=1 $(PY) -m accelpatch demo

test: setup
	OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(PY) -m pytest -q tests

clean:
	rm -rf $(VENV) build *.egg-info
