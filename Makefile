# Two entry points, both working from a clean clone: `make demo` and `make test`.
#
# Setup says what it installs and why it takes time, and resolves once, with uv:
#   1. create $(VENV) and pip-install uv into it (one ~20 MB wheel: the installer for everything else);
#   2. ask pip, without installing anything, where $(TORCH_SPEC) comes from: pip's configuration decides, so on
#      a machine with the CPU wheel on disk that file is used and no multi-GB CUDA build is pulled;
#   3. one `uv pip install` of that torch + accelpatch: `make demo` installs `-e .` (no test tools, no triton),
#      `make test` installs `-e .[dev]` (adds pytest, hypothesis, triton (a ~290 MB wheel), the notebook and
#      plotting tools, ...).
# uv does not compile bytecode at install (pip did, for ~40 s here); instead `make demo` and `make test` let Python
# cache what they import, even where PYTHONDONTWRITEBYTECODE is set (which would make every run, and each of the
# suite's many Python processes, compile torch's modules again).
# If uv cannot be installed, or with USE_UV=0, step 3 is one `pip install` instead (slower), and says so.
# Stamps in $(VENV) make a second run install nothing; editing setup.cfg, setup.py or this file re-installs
# (uv then changes only what differs). `make clean` starts over. PYTEST_ARGS picks tests: make test PYTEST_ARGS=tests/test_tiers.py
# The whole suite runs on two pytest-xdist workers (the machine's 2 cores; --dist loadfile keeps each file in one
# worker, so module fixtures are built once).
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
UV := $(VENV)/bin/uv
TORCH_SPEC ?= torch==2.13.0
USE_UV ?= 1
PYTEST_ARGS ?= -n 2 --dist loadfile tests
, := ,

.PHONY: demo test docs setup setup-demo clean test-oldest setup-oldest

# Prints "torch @ <where pip would take it from>", or nothing when a torch satisfying TORCH_SPEC is installed.
TORCH_WHERE := import json, subprocess, sys; \
  r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-deps", "--quiet", "--report", "-", \
  "$(TORCH_SPEC)"], capture_output=True, text=True); \
  r.returncode and sys.exit(r.stderr); \
  todo = json.loads(r.stdout)["install"]; \
  print("torch @ " + todo[0]["download_info"]["url"] if todo else "")

# $(call install,REQUIREMENT,WHAT IT BRINGS)
define install
	@set -e; \
	if [ "$(USE_UV)" != 0 ] && [ -x $(UV) ]; then \
	  torch=$$($(PY) -c '$(TORCH_WHERE)'); \
	  if [ -n "$$torch" ]; then \
	    echo "==> torch from $${torch#torch @ } (CPU wheel ~190 MB, ~750 MB unpacked)"; \
	  else \
	    echo "==> torch $$($(PY) -c 'import importlib.metadata as m; print(m.version("torch"))') is already installed"; \
	  fi; \
	  echo "==> resolving and installing $(1) with uv, in one go: $(2)"; \
	  echo "    $(UV) pip install --python $(PY) $${torch:+\"$$torch\" }-e \"$(1)\""; \
	  $(UV) pip install --python $(PY) $${torch:+"$$torch"} -e "$(1)"; \
	else \
	  echo "==> installing $(TORCH_SPEC) and $(1) with pip (uv unavailable or USE_UV=0): $(2)"; \
	  echo "    slower than uv: it unpacks one package at a time and compiles bytecode, so it stays quiet for"; \
	  echo "    a minute or more after 'Installing collected packages' (torch ~750 MB$(if $(findstring dev,$(1)),$(,) triton ~1 GB))"; \
	  echo "    $(PY) -m pip install \"$(TORCH_SPEC)\" -e \"$(1)\""; \
	  $(PY) -m pip install "$(TORCH_SPEC)" -e "$(1)"; \
	fi
endef

$(VENV)/.tools: Makefile
	@echo "==> setting up $(VENV) (first run, or this Makefile changed; later runs skip this): about 45 s with a fast"
	@echo "    network and a cold cache, most of it downloading and unpacking packages"
	@test -x $(PY) || { echo "==> creating $(VENV) with $$($(PYTHON) --version)"; $(PYTHON) -m venv $(VENV); }
	@if [ "$(USE_UV)" != 0 ]; then \
	  echo "==> installing uv (the fast installer for the rest) with pip"; \
	  if log=$$($(PY) -m pip install --quiet "uv>=0.5" 2>&1); then $(UV) --version; \
	  else echo "$$log"; echo "==> could not install uv (above): falling back to pip for the rest (slower)"; fi; \
	fi
	@touch $@

# What `make demo` needs: torch and accelpatch's own dependencies.
$(VENV)/.installed-demo: $(VENV)/.tools setup.cfg setup.py
	$(call install,.,torch + accelpatch's dependencies (diffusers$(,) transformers$(,) accelerate ...; ~65 MB of downloads))
	@touch $@

# What `make test` needs: the above plus the dev extra.
$(VENV)/.installed: $(VENV)/.tools setup.cfg setup.py
	$(call install,.[dev],torch + accelpatch's dependencies + the dev extra (pytest$(,) hypothesis$(,) triton$(,) notebook and plotting tools ...; ~450 MB of downloads$(,) triton alone ~290 MB))
	@touch $@ $(VENV)/.installed-demo

setup: $(VENV)/.installed

setup-demo: $(VENV)/.installed-demo

demo: setup-demo
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 $(PY) -m accelpatch demo

test: setup
	PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(PY) -m pytest -q $(PYTEST_ARGS)

# The documentation site (docs/, mkdocs.yml) into site/: --strict fails on any warning (a broken link, a page left
# out of the nav, a docstring mkdocstrings cannot read). The tools come with the dev extra; CI runs it after
# `make test`.
docs: setup
	NO_MKDOCS_2_WARNING=1 $(PY) -m mkdocs build --strict -d site

# The oldest supported torch (setup.cfg's lower bound; the GPU image's torch and triton), tested by CI after the
# main suite: a smoke subset (tiers, bit identity, compile, the Triton interpreter, doctor) in a second venv cached
# outside the clone. It holds accelpatch's dependencies only; the tests import this clone through PYTHONPATH, so the
# cache never goes stale. First run: creates the venv and downloads torch $(OLDEST_TORCH) (a CUDA build, ~3 GB; about
# 2.5 min measured here); later runs reuse it, and re-install only when the requirements change. If it cannot be
# created, the target fails with the reason: CI does not pass without the second torch.
OLDEST_TORCH ?= 2.11.0
OLDEST_TRITON ?= 3.6.0
OLDEST_VENV ?= $(HOME)/.cache/accelpatch/ci-venv-torch2.11
OLDEST_PY := $(OLDEST_VENV)/bin/python
OLDEST_TESTS ?= tests/test_tiers.py tests/test_lossless_bit_identity.py tests/test_compile.py tests/test_torch_compat.py \
  tests/test_sol_attn_dense_rows.py tests/ops/test_sol_attn_triton.py tests/ops/test_fused_triton.py \
  tests/test_triton_interpreter_probes.py tests/test_doctor.py
OLDEST_PYTEST_ARGS ?= -n 2 --dist loadfile $(OLDEST_TESTS)

setup-oldest:
	@set -e; \
	want="torch==$(OLDEST_TORCH) triton==$(OLDEST_TRITON) $$($(PYTHON) .ci/requirements.py | tr '\n' ' ')"; \
	stamp="$(OLDEST_VENV)/.accelpatch-requirements"; \
	if [ -x "$(OLDEST_PY)" ] && [ "$$(cat "$$stamp" 2>/dev/null)" = "$$want" ]; then \
	  echo "==> torch $(OLDEST_TORCH) venv: using the cached $(OLDEST_VENV)"; exit 0; fi; \
	echo "==> torch $(OLDEST_TORCH) venv: installing into $(OLDEST_VENV) (first run: torch $(OLDEST_TORCH) is a CUDA build"; \
	echo "    of ~3 GB to download, about 2.5 min here; later runs reuse it)"; \
	test -x "$(OLDEST_PY)" || $(PYTHON) -m venv "$(OLDEST_VENV)" || \
	  { echo "error: could not create $(OLDEST_VENV): CI cannot test torch $(OLDEST_TORCH)" >&2; exit 1; }; \
	PIP_CONSTRAINT= $(OLDEST_PY) -m pip install -q --disable-pip-version-check $$want || \
	  { echo "error: could not install torch $(OLDEST_TORCH) and accelpatch's requirements into $(OLDEST_VENV)" \
	    "(above): CI cannot test the oldest supported torch" >&2; exit 1; }; \
	echo "$$want" > "$$stamp"

test-oldest: setup-oldest
	PYTHONPATH=$(CURDIR) PYTHONDONTWRITEBYTECODE= OMP_NUM_THREADS=1 TRITON_INTERPRET=1 $(OLDEST_PY) -m pytest -q \
	  -p no:cacheprovider $(OLDEST_PYTEST_ARGS)
	@echo "==> the GPU day's one command rehearsed on CPU, shaped like the lent GPU image: torch $(OLDEST_TORCH), no"
	@echo "    diffusers or pydantic, the six carried wheels installed from a folder with no index (about 30 s)"
	PYTHON=$(OLDEST_PY) benchmarks/gpu/rehearse.sh --dry-run

clean:
	rm -rf $(VENV) build *.egg-info site
