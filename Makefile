# Fresh-machine entry points. Each target sets up .venv with the pinned stack when needed.
#   make demo   tokenizer on the built-in corpus, a tiny CrossBERT pretraining run, HF export
#   make test   the test suite (CROSSBERT_DATA defaults to ../shared/data)
#   make fault-inject   KILLS random kill -9s of a tiny run, each resumed; checks a bitwise-equal end
PYTHON ?= python3
VENV ?= .venv
PY := $(VENV)/bin/python
RUN ?= runs/demo
KILLS ?= 50
PYTEST_ARGS ?=

.PHONY: setup demo test bench fault-inject clean

$(VENV)/.installed: requirements.txt pyproject.toml
	test -x $(PY) || $(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q -r requirements.txt
	$(PY) -m pip install -q --no-deps -e .
	touch $@

setup: $(VENV)/.installed

demo: setup
	rm -rf $(RUN)
	$(PY) -m crossbert_jax.tokenizer --input=builtin --vocab_size=1024 --output=$(RUN)/tokenizer/spm.model
	$(PY) -m crossbert_jax.train --config=configs/crossbert.py:tiny --workdir=$(RUN)/crossbert \
	    --config.data.tokenizer=$(RUN)/tokenizer/spm.model
	$(PY) -m crossbert_jax.export --workdir=$(RUN)/crossbert --output=$(RUN)/hf --verify --similarity --force

test: setup
	CROSSBERT_DATA=$${CROSSBERT_DATA:-../shared/data} $(PY) -m pytest -q $(PYTEST_ARGS)

bench: setup
	$(PY) -m crossbert_jax.bench --config=configs/crossbert.py:small --out=bench_results.json

fault-inject: setup
	nice -n 10 $(PY) tools/fault_inject.py --kills=$(KILLS) --workdir=runs/fault_inject

clean:
	rm -rf runs bench_results.json
