# Fresh-machine entry points. Each target sets up .venv with the pinned stack when needed.
#   make demo   tokenizer on the built-in corpus, a tiny CrossBERT pretraining run, HF export, and a
#               frozen word-order probe of the run against its random init (built-in data)
#   make test   the unit tier: no training run, no subprocess (tests/unit; docs/testing.md)
#   make test-integration   in-process runs on shared session runs, real data (CROSSBERT_DATA defaults to ../shared/data)
#   make test-slow   kill loops, clusters, multi-process, gs:// end to end (tests/slow and the cases marked slow)
#   make test-beyond-unit   the integration and slow tiers in one session (what CI runs, with WORKERS=2)
#   WORKERS=N   (any test target) N pytest-xdist worker processes, grouped tests kept together; default 2 (the
#               measured choice on 2 cores, docs/testing.md); WORKERS=1 runs serially
#   make lint   ruff (pyproject's [tool.ruff]) and the yapf format check ([tool.yapf]); make format rewrites
#   make setup-tpu   .venv-tpu: .venv's pinned stack + jax[tpu]/libtpu (on any host, the pre-flight
#                    compile for a TPU topology: JAX_PLATFORMS=cpu .venv-tpu/bin/python -m crossbert_jax.compile)
#   make setup-gpu   .venv with jax[cuda12] on top (NVIDIA hosts)
#   make test-tpu    the libtpu tests (compile for v5p:2x2x2) in .venv-tpu
#   make fault-inject   KILLS random kill -9s of a tiny run, each resumed; checks a bitwise-equal end
#   make fault-inject-sweep   KILLS random kill -9s of a tiny 2-run sweep; every run finished once, no orphans
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
TPU_VENV ?= .venv-tpu
RUN ?= runs/demo
KILLS ?= 50
PYTEST_ARGS ?=
WORKERS ?= 2
# pytest-xdist's workers: tests marked xdist_group (sharing a session's expensive fixture) run on one worker.
XDIST := $(if $(filter-out 0 1,$(WORKERS)),-n $(WORKERS) --dist loadgroup,)

.PHONY: setup setup-tpu setup-gpu demo test test-integration test-slow test-beyond-unit test-tpu lint format bench fault-inject fault-inject-sweep clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

setup: $(VENV)/.installed

# The formatter and linter, pinned beside the stack (not needed to train).
$(VENV)/.installed-lint: $(VENV)/.installed requirements-lint.txt
	$(PY) -m pip install -q -r requirements-lint.txt
	touch $@

FORMATTED := crossbert_jax tests tools configs experiments

lint: $(VENV)/.installed-lint
	$(PY) -m ruff check .
	$(PY) -m yapf --diff --recursive --parallel $(FORMATTED) > /dev/null || { echo "yapf: files not formatted; run make format" >&2; exit 1; }

format: $(VENV)/.installed-lint
	$(PY) -m yapf --in-place --recursive --parallel $(FORMATTED)

# A second venv for libtpu (in the main one it would make every CPU run probe for a TPU), layered on the main one:
# a .pth file adds .venv's site-packages (and runs its .pth files: the editable install), so the pinned stack is
# installed once and pip adds only what requirements-tpu.txt has beyond it (libtpu). On a TPU VM, launch/tpu.sh
# installs the whole stack into .venv-tpu instead (there is no .venv there).
# A venv's site-packages, printed by its python.
PURELIB := -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])'
$(TPU_VENV)/.installed: $(VENV)/.installed requirements-tpu.txt
	test -x $(TPU_VENV)/bin/python || $(PYTHON) -m venv $(TPU_VENV)
	echo "import site; site.addsitedir('$$($(PY) $(PURELIB))')" > "$$($(TPU_VENV)/bin/python $(PURELIB))/crossbert_main_venv.pth"
	$(TPU_VENV)/bin/python -m pip install -q -r requirements-tpu.txt
	touch $@

setup-tpu: $(TPU_VENV)/.installed

$(VENV)/.installed-gpu: $(VENV)/.installed requirements-gpu.txt
	$(PY) -m pip install -q -r requirements-gpu.txt
	touch $@

setup-gpu: $(VENV)/.installed-gpu

demo: setup
	rm -rf $(RUN)
	$(PY) -m crossbert_jax.tokenizer --input=builtin --vocab_size=1024 --output=$(RUN)/tokenizer/spm.model
	$(PY) -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir=$(RUN)/crossbert \
	    --config.data.tokenizer=$(RUN)/tokenizer/spm.model
	$(PY) -m crossbert_jax.export --workdir=$(RUN)/crossbert --output=$(RUN)/hf --verify --force
	$(PY) -m crossbert_jax.evaluate --workdir=$(RUN)/crossbert --word_order

test: setup
	CROSSBERT_DATA=$${CROSSBERT_DATA:-../shared/data} $(PY) -m pytest -q -m unit $(XDIST) $(PYTEST_ARGS)

test-integration: setup
	CROSSBERT_DATA=$${CROSSBERT_DATA:-../shared/data} $(PY) -m pytest -q -m integration $(XDIST) $(PYTEST_ARGS)

test-slow: setup
	CROSSBERT_DATA=$${CROSSBERT_DATA:-../shared/data} $(PY) -m pytest -q -m slow $(XDIST) $(PYTEST_ARGS)

test-beyond-unit: setup
	CROSSBERT_DATA=$${CROSSBERT_DATA:-../shared/data} $(PY) -m pytest -q -m "integration or slow" $(XDIST) $(PYTEST_ARGS)

test-tpu: setup-tpu
	JAX_PLATFORMS=cpu $(TPU_VENV)/bin/python -m pytest -q tests/unit/test_compile.py -k topology $(PYTEST_ARGS)

bench: setup
	$(PY) -m crossbert_jax.bench --config=configs/crossbert.py:small --out=bench_results.json --force

fault-inject: setup
	$(PY) tools/fault_inject.py --kills=$(KILLS) --workdir=runs/fault_inject
	$(PY) tools/fault_inject_prepare.py --kills=$(KILLS) --workdir=runs/fault_inject_prepare

fault-inject-sweep: setup
	$(PY) tools/fault_inject_sweep.py --kills=$(KILLS) --root=runs/fault_inject_sweep

clean:
	rm -rf runs bench_results.json
