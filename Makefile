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
	$(BIN)/plan simulate --model gpt3-175b --cluster cluster_specs/selene-a100.yaml \
		--tp 8 --pp 8 --dp 1 --vp 3 --mbs 1 --gbs 64 --recompute full

test: $(BIN)/plan
	$(BIN)/ruff check .
	$(BIN)/pytest -q

lint: $(BIN)/plan
	$(BIN)/ruff check .
