"""Limits on what a user may ask for: generous physical bounds (several times the largest
training runs published), so that every size, time and price derived from an input stays
finite and every search and simulation stays bounded. Each is checked where the number
enters: a spec field (`spec_field(max=...)`), a flag (`planner/commands/args.py`) or a
what-if scenario (`planner/whatif/scenarios.py`)."""

__all__ = ["MAX_GLOBAL_BATCH", "MAX_GPUS", "MAX_SEQ_LEN", "MAX_TOKENS", "MAX_USD"]

MAX_GPUS = 131_072  # GPUs in one cluster
MAX_GLOBAL_BATCH = 65_536  # sequences per iteration (BERT-large with LAMB used 65,536)
MAX_SEQ_LEN = 16_777_216  # tokens per sequence
MAX_TOKENS = 1e17  # a token budget (the largest published runs: ~1.5e13)
MAX_USD = 1e13  # a budget in dollars
