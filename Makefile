# Set-up and everyday commands. `make install` then `make test` on a fresh machine; `make test` and `make demo` also
# set up the project's virtual environment themselves where it is missing (the demo the package alone, the tests
# the test extra), unless PYTHON names the Python to use.
VENV ?= .venv
SAMPLE_MODEL ?= data/samples/model
ifeq ($(origin PYTHON),undefined)
PYTHON := $(VENV)/bin/python
BASE_READY := $(VENV)/.nllb-base
TEST_READY := $(VENV)/.nllb-test
endif
# The GPU targets: the project's virtual environment where there is one, else the system Python (the GPU machine's
# image already has every dependency, and no package index to install from).
GPU_PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)

.PHONY: install test gpu-test gpu-bench demo clean

install:
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'
	touch $(VENV)/.nllb-base $(VENV)/.nllb-test

$(VENV)/.nllb-test:
	$(MAKE) install

$(VENV)/.nllb-base:
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e .
	touch $@

# the suite in TEST_WORKERS processes, each test file in one of them (its module fixtures, a Ray or a Spark, made once)
TEST_WORKERS ?= 2
test: $(TEST_READY)
	$(PYTHON) -m pytest -q -n $(TEST_WORKERS) --dist loadfile

gpu-test:
	$(GPU_PYTHON) -m pytest -q -m gpu tests/gpu

# The measurements of docs/PERFORMANCE.md on a GPU with transformers beside nllbcli (its parts: 10-16 minutes;
# bench/README.md says what each answers): the harness's table (greedy and beam 4 at each engine's best batch, every
# sentence 40 tokens and each at its own length), then whole jobs (A: 1,000 sentences; B: start-up; C: 100,000
# sentences against the engine alone; R: 20,000 sentences, forced and real lengths), then nllb score against greedy
# translation of the same pairs. JSON lines into $(BENCH_OUT).
BENCH_OUT ?= bench-results
gpu-bench:
	mkdir -p $(BENCH_OUT)
	$(GPU_PYTHON) -m bench.harness --ours 4096x1,2048x4 --transformers 4096x1,1024x4 --lengths forced,real --out $(BENCH_OUT)/harness.json
	$(GPU_PYTHON) -m bench.e2e --measure A,B --tf-batch 1000 --model-dir $(BENCH_OUT)/model --cache-dir $(BENCH_OUT)/kernels --out $(BENCH_OUT)/e2e.jsonl
	$(GPU_PYTHON) -m bench.e2e --measure C --sentences 100000 --model-dir $(BENCH_OUT)/model --cache-dir $(BENCH_OUT)/kernels --out $(BENCH_OUT)/e2e.jsonl
	$(GPU_PYTHON) -m bench.e2e --measure R --sentences 20000 --tf-batch 1024 --model-dir $(BENCH_OUT)/model --cache-dir $(BENCH_OUT)/kernels --out $(BENCH_OUT)/e2e.jsonl
	$(GPU_PYTHON) -m bench.score_speed --model-dir $(BENCH_OUT)/model --cache-dir $(BENCH_OUT)/kernels --out $(BENCH_OUT)/score.jsonl

demo: $(BASE_READY)
	@$(PYTHON) -m nllbcli.demo $(SAMPLE_MODEL)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
