# Set-up and everyday commands. `make install` then `make test` on a fresh machine.
VENV ?= .venv
# Use the project's virtual environment when there is one (make install makes it), else the system Python
# (the GPU machine's image already has every dependency).
PYTHON ?= $(if $(wildcard $(VENV)/bin/python),$(VENV)/bin/python,python3)
SAMPLE_MODEL ?= data/samples/model

.PHONY: install test gpu-test demo clean

install:
	python3 -m venv $(VENV)
	$(VENV)/bin/python -m pip install --quiet --upgrade pip
	$(VENV)/bin/python -m pip install --quiet -e '.[test]'

test:
	$(PYTHON) -m pytest -q

gpu-test:
	$(PYTHON) -m pytest -q -m gpu tests/gpu

demo:
	@$(PYTHON) -m nllbcli.demo $(SAMPLE_MODEL)

clean:
	rm -rf $(VENV) build dist *.egg-info .pytest_cache
	find . -name __pycache__ -type d -prune -exec rm -rf {} +
