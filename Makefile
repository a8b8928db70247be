# regattn: two commands do all set-up on a fresh machine.
#   make demo   derive a map and verify it (the main job)
#   make test   run the test suite (PROFILE=ci by default; PROFILE=thorough for long local runs) in JOBS
#               pytest-xdist worker processes (2 by default; JOBS=auto: one per core; JOBS=0: one process)
#   make docs   build the documentation (warnings are errors) into docs/_build/html
# Set-up installs torch==2.13.0 first, then the package with its extras. pip takes torch from the indexes it is
# configured with, unless TORCH_INDEX names another. On PyPI, torch 2.13.0 for Linux is the CUDA build, which
# brings about 20 nvidia-* CUDA packages (several GB); where pip also finds a CPU wheel (2.13.0+cpu, e.g. a local
# one in its find-links), it takes that one. The tests need no GPU: PyTorch's CPU wheel from PyTorch's own index,
# on first set-up (or after `make clean`), with
#   make test TORCH_INDEX=https://download.pytorch.org/whl/cpu      (the same for make setup, demo, docs)
PYTHON ?= python3
VENV ?= .venv
PROFILE ?= ci
JOBS ?= 2
TORCH_INDEX ?=
BIN := $(VENV)/bin
# the ci profile's XLA compiles without LLVM's optimisations and with XLA:CPU's loop emitters in place of its fusion
# emitters: the tests' arrays are small and most of tests/jax's time is compilation (7:02 -> 5:12 on two workers for
# the first; the second halves tests/jax's CPU time again, 784 -> 380 s: docs/benchmarks.md); the other profiles
# compile as users do.  (An XLA that no longer knows a flag refuses to start: drop it here then.)
XLA_TEST_FLAGS_ci := --xla_backend_optimization_level=0 --xla_cpu_use_fusion_emitters=false

.PHONY: setup demo test docs clean

$(BIN)/regattn: pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(BIN)/python -m pip install --quiet --upgrade pip
	$(BIN)/python -m pip install --quiet torch==2.13.0 $(if $(TORCH_INDEX),--index-url $(TORCH_INDEX))
	$(BIN)/python -m pip install --quiet -e '.[test,torch,jax,triton,peers,hf]'
	touch $@

setup: $(BIN)/regattn

demo: setup
	$(BIN)/regattn verify tsallis --alpha 3/2
	$(BIN)/regattn verify --expr "p*log(p) + p**2/2" --name shannon_gini
	$(BIN)/regattn verify gini --continuous

# (that the generated files are current is tests/derive/test_cli.py::test_generate_writes_and_checks_a_folder_and_the_committed_files_are_current)
test: setup
	$(BIN)/ruff check derive numeric tests benchmarks examples
	XLA_FLAGS="$(strip $(XLA_FLAGS) $(XLA_TEST_FLAGS_$(PROFILE)))" \
		$(BIN)/python -m pytest --hypothesis-profile=$(PROFILE) -q -rs -n $(JOBS) --dist worksteal --durations=30

docs: setup
	$(BIN)/python -m pip install --quiet -e '.[test,docs]'
	$(BIN)/sphinx-build -W --keep-going -q -b html docs docs/_build/html

clean:
	rm -rf $(VENV) .pytest_cache .hypothesis build *.egg-info docs/_build docs/_generated
