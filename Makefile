# Set-up and checks. `make demo` and `make test` work on a fresh machine: they create
# .venv and install everything themselves. torch is pinned here (a CPU build) so that
# pip does not fetch a multi-GB CUDA build; pyproject.toml keeps a normal range.
PYTHON ?= python3
VENV ?= .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.pardiag-installed
TORCH_PIN ?= torch==2.13.0
# pardiag itself needs no torch (README.md, "Install"); the tests run real jobs (torch), check
# the analysis against HTA (the hta extra) and the collectors under Lightning, transformers and
# Accelerate (the frameworks extra).
EXTRAS ?= test,hta,frameworks
# DeepSpeed is published as source that imports torch to build: built against the torch
# above (no build isolation, which would fetch another torch). Its test skips without it.
DEEPSPEED ?= deepspeed>=0.14

.PHONY: venv demo test bench clean

# Reinstalled whenever pyproject.toml (dependencies, extras) or this file (pins, EXTRAS) changes.
# torch goes in first, and is named again with the extras so that no extra can replace it.
$(STAMP): pyproject.toml Makefile analyzers/_scan.c
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip
	$(BIN)/python -m pip install -q "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q -e '.[$(EXTRAS)]' "$(TORCH_PIN)"
	$(BIN)/python -m pip install -q --no-build-isolation "$(DEEPSPEED)" "$(TORCH_PIN)" \
		|| echo "DeepSpeed could not be installed: its test will skip"
	touch $(STAMP)

venv: $(STAMP)

demo: $(STAMP)
	$(BIN)/pardiag demo

# The report tests open the HTML in headless Chromium and the TUI tests drive the real
# program in tmux (Debian's packages); those tests skip with a reason where the
# packages cannot be installed.
TEST_PACKAGES := chromium tmux
# The tests run in two parts: first the `timed` ones, which assert on how long things took,
# one at a time with the machine to themselves (first: after the parallel part, this host's
# speed drifted for a while, 8-20% between jobs still after 30 s idle, and test_diff's
# check that the machine kept its speed skipped its pairs in 2 of 2 suite runs),
# then the rest on TEST_WORKERS workers at once (pytest-xdist; a module's shared job stays
# on one worker).
TEST_WORKERS ?= 2

test: $(STAMP)
	@missing=""; for p in $(TEST_PACKAGES); do command -v $$p >/dev/null 2>&1 || missing="$$missing $$p"; done; \
	if [ -n "$$missing" ]; then \
		if command -v apt-get >/dev/null 2>&1 && [ "$$(id -u)" = 0 ]; then \
			(apt-get update -qq && apt-get install -y -qq $$missing >/dev/null) || echo "could not install$$missing: those tests will skip"; \
		else echo "not installed:$$missing: those tests will skip"; fi; \
	fi
	@rc=0; \
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider --durations=20 -m timed tests || rc=1; \
	$(BIN)/python -m pytest -q -rs -p no:cacheprovider -n $(TEST_WORKERS) --dist loadgroup --durations=20 -m "not timed" tests || rc=1; \
	exit $$rc

bench: $(STAMP)
	$(BIN)/python benchmarks/overhead.py

clean:
	rm -rf $(VENV) pardiag-runs build *.egg-info

# GPU check (benchmarks/gpu_check.py, README.md "GPU check"). gpu-wheels, where pip works:
# the wheels the GPU image lacks, at the versions .venv tests with, into .whl/ (GPU_PY: the
# GPU machine's Python). gpu-check, on the GPU machine with its own python3 and torch:
# installs .whl/ when present (no network, no dependencies), then checks. make turns every
# failure into its own exit 2: run the script itself for its codes (1 failed, 3 no GPU).
GPU_PYTHON ?= python3
GPU_PY ?= 3.12
GPU_CHECK_ARGS ?=

.PHONY: gpu-wheels gpu-check

gpu-wheels: $(STAMP)
	$(BIN)/python benchmarks/gpu_check.py --download-wheels .whl --python-version $(GPU_PY)

gpu-check:
	@$(GPU_PYTHON) benchmarks/gpu_check.py --wheels .whl $(GPU_CHECK_ARGS)
