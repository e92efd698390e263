# Two set-up commands (see README): `make demo` and `make test`.
PY ?= python3
VENV := .venv
BIN := $(VENV)/bin

# Every install holds torch at the CPU build (constraints.txt; PIP_CONSTRAINT reaches
# pip's build environments too) and builds no DeepSpeed CUDA ops.
PIP_INSTALL := PIP_CONSTRAINT=$(CURDIR)/constraints.txt DS_BUILD_OPS=0 $(BIN)/pip install -q \
	-c constraints.txt

$(BIN)/plan: pyproject.toml constraints.txt
	$(PY) -m venv $(VENV)
	$(PIP_INSTALL) -e '.[dev]'
	touch $(BIN)/plan

# the frameworks whose own parsers the export tests load configs with
$(VENV)/.frameworks: $(BIN)/plan
	$(PIP_INSTALL) -e '.[dev,frameworks]'
	touch $@

.PHONY: demo test test-slow lint report
demo: $(BIN)/plan
	mkdir -p scratch
	$(BIN)/plan search --model gpt3-175b --cluster cluster_specs/selene-a100.yaml \
		--gbs 1536 --tokens 300e9 -o scratch/plan.yaml
	@echo
	@echo "wrote scratch/plan.yaml: the best plan above, as the executor reads it. Next:"
	@echo "  . .venv/bin/activate"
	@echo "  plan simulate --plan scratch/plan.yaml --gantt scratch/gantt.png   # its timeline"
	@echo "  plan export scratch/plan.yaml --format megatron --approximate   # Megatron-LM flags"
	@echo "  make report   # what-if scenarios of a mixed cluster: reports/mixed-a100-v100/"

# The tests that need no quiet machine run on every core (pytest-xdist), then the
# `serial` ones (they time what they run, or start several processes) one at a time.
# `slow` tests (over 20 s each alone on 2 cores: exhaustive oracles, timing benchmarks,
# whole runs with a host profile) are left to `make test-slow`; `pytest -m fuzz` is the
# long property-based run.
TEST_JOBS ?= auto
test: $(VENV)/.frameworks
	$(BIN)/ruff check .
	$(BIN)/mypy
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile -m 'not fuzz and not serial and not slow'
	$(BIN)/pytest -q -m 'serial and not fuzz and not slow'

test-slow: $(VENV)/.frameworks
	$(BIN)/pytest -q -n $(TEST_JOBS) --dist loadfile -m 'slow and not fuzz and not serial'
	$(BIN)/pytest -q -m 'slow and serial and not fuzz'

lint: $(BIN)/plan
	$(BIN)/ruff check .
	$(BIN)/mypy

# The example what-if report committed under reports/ (about 20 seconds on 2 cores).
report: $(BIN)/plan
	$(BIN)/plan what-if --model llama2-13b --cluster cluster_specs/mixed-a100-v100.yaml \
		--tokens 1e12 --gbs 256 --seq 4096 --dtype fp16 \
		--scenario "add 8 H100 nodes: add H100-80GB-SXM 64; price H100-80GB-SXM 3.0" \
		--scenario "retire the V100s: remove V100-32GB-SXM2 128" \
		--scenario "V100s swapped for A100s: swap V100-32GB-SXM2 A100-80GB-SXM" \
		--scenario "V100 nodes at 2x NIC bandwidth: scale-nic V100-32GB-SXM2 2" \
		--scenario "V100 price halved: price V100-32GB-SXM2 0.4" \
		--scenario "Llama 2 70B instead: model llama2-70b" \
		--scenario "Llama 3 405B on the V100s alone: model llama3-405b; remove A100-80GB-SXM 128" \
		-o reports/mixed-a100-v100/
