# Two commands on a fresh machine: `make demo` and `make test`.
PYTHON ?= python3
VENV   := .venv
BIN    := $(VENV)/bin
STAMP  := $(VENV)/.installed

.PHONY: demo test lint bench faults fuzz clean

$(STAMP): pyproject.toml setup.py $(wildcard otel_rollout/*.c otel_rollout/*.h)
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	$(BIN)/pip install --quiet -e '.[test]'
	$(BIN)/pip install --quiet atheris || echo "atheris does not install here; its fuzz test is skipped"
	touch $(STAMP)

demo: $(STAMP)
	$(BIN)/otel-rollout demo --log-dir runs/demo

test: $(STAMP)
	$(BIN)/ruff check otel_rollout tests bench dashboards
	$(BIN)/mypy
	$(BIN)/python -m pytest -q

bench: $(STAMP)
	$(BIN)/python bench/run.py

faults: $(STAMP)
	$(BIN)/python bench/faults.py

fuzz: $(STAMP)
	$(BIN)/python tests/fuzz_reader.py -runs=1000000 -artifact_prefix=/tmp/

clean:
	rm -rf $(VENV) runs build *.egg-info .pytest_cache .hypothesis
