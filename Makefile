# Two set-up commands (see README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

$(BIN)/plan: pyproject.toml
	$(PY) -m venv $(VENV)
	$(BIN)/pip install -q -e '.[dev]'
	touch $(BIN)/plan

.PHONY: demo test lint
demo: $(BIN)/plan
	$(BIN)/plan search --model gpt3-175b --cluster cluster_specs/selene-a100.yaml \
		--gbs 1536 --tokens 300e9 -o plan.yaml

test: $(BIN)/plan
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: $(BIN)/plan
	$(BIN)/ruff check .
