"""What the property-based CLI tests share: strategies for clusters, models and layouts,
one bounded call of `plan` in-process, and the property every call must have.

Every call ends in a result (exit 0) or one line and exit 2 (`plan search` may also say
"no plan" in one line, exit 1); it never raises another exception, never runs past its
CPU-time budget, and its --json output holds no NaN, no infinity and no negative time.
"""

from __future__ import annotations

import collections
import contextlib
import itertools
import json
import math
import re
import signal
import time

import yaml
from hypothesis import strategies as st

from planner.cli import main
from profiler.devices import NIC_KINDS, catalog

GPU_TYPES = sorted(name for name, d in catalog().items() if d.vendor != "cpu")
ISLANDS = ("ib-a", "ib-b", "roce", "wan")
STATS: collections.Counter = collections.Counter()  # (command, outcome) -> calls
SLOWEST: dict[str, float] = {}  # command -> the slowest call's CPU seconds
REASONS: collections.Counter = collections.Counter()  # (command, what a refusal named)
KNOWN = -1  # the "exit code" of a call that ended in a known crash (KNOWN_CRASHES)


class CallTooLong(BaseException):
    """A call of `plan` ran past its CPU-time budget (a hang, for these tests)."""


# Crashes found by these tests whose root cause is in code being refactored elsewhere
# (planner/search, planner/simulator, planner/predict): each has a strict xfail regression
# test, which turns into a failure when the crash is fixed; then its entry goes. A call
# that ends in one of them counts as "known" instead of failing the property.
# (exception type, message part, a file of the traceback, the file it ends in, the test)
KNOWN_CRASHES: list[tuple[type[BaseException], str, str, str, str]] = []  # all fixed


def known_crash(err: BaseException) -> str | None:
    """The regression test of a known crash `err` is, or None."""
    import traceback

    files = [f.filename.replace("\\", "/") for f in traceback.extract_tb(err.__traceback__)]
    for kind, message, through, last, test in KNOWN_CRASHES:
        if (type(err) is kind and message in str(err) and files
                and any(through in f for f in files) and last in files[-1]):
            return test
    return None


# --- strategies ---------------------------------------------------------------------------

@st.composite
def clusters(draw: st.DrawFn, *, max_types: int = 4, max_nodes: int = 64,
             max_gpus_per_node: int = 16) -> dict:
    """A ClusterSpec as YAML data: 1-4 GPU types, islands of several NIC kinds, a link for
    every pair of islands, node fields set or left to the catalog."""
    types = draw(st.lists(st.sampled_from(GPU_TYPES), min_size=1, max_size=max_types,
                          unique=True))
    islands = draw(st.lists(st.sampled_from(ISLANDS), min_size=1, max_size=3, unique=True))
    groups = []
    for i, gpu in enumerate(types):
        group = {"name": f"g{i}", "gpu": gpu, "num_nodes": draw(st.integers(1, max_nodes)),
                 "island": draw(st.sampled_from(islands))}
        optional = {
            "gpus_per_node": st.integers(1, max_gpus_per_node),
            "nic": st.sampled_from(NIC_KINDS),
            "nics_per_node": st.integers(1, 16),
            "nic_bandwidth_gbit_per_s": st.floats(0.1, 3200),
            "intra_node_bandwidth_gb_per_s": st.floats(0.1, 1800),
            "price_per_gpu_hour_usd": st.floats(0, 20),
        }
        for key, values in optional.items():
            if draw(st.booleans()):
                group[key] = draw(values)
        if "gpus_per_node" in group and draw(st.booleans()):  # an NVLink domain of 1-4 nodes
            group["nvlink_domain_gpus"] = group["gpus_per_node"] * draw(st.integers(1, 4))
        groups.append(group)
    used = sorted({g["island"] for g in groups})
    links = [{"islands": [a, b], "bandwidth_gbit_per_s": draw(st.floats(0.1, 10_000)),
              "latency_ms": draw(st.floats(0, 200)), "kind": draw(st.sampled_from(NIC_KINDS)),
              "price_per_gb_usd": draw(st.floats(0, 1))}
             for a, b in itertools.combinations(used, 2)]
    return {"name": "fuzz-cluster", "node_groups": groups, "island_links": links}


@st.composite
def models(draw: st.DrawFn, *, max_layers: int = 96, max_kv_heads: int = 16,
           max_head_dim: int = 256, max_vocab: int = 256_000, max_seq: int = 32_768) -> dict:
    """A ModelSpec as YAML data: GQA (kv heads dividing heads) or not, odd layer counts,
    tied or untied embeddings, every activation, norm and position embedding."""
    kv_heads = draw(st.integers(1, max_kv_heads))
    heads = kv_heads * draw(st.sampled_from((1, 1, 2, 4, 8)))
    position = draw(st.sampled_from(("learned", "rope", "alibi")))
    head_dim = draw(st.integers(1, max_head_dim))
    if position == "rope":  # it rotates pairs of a head's dimensions: an even width
        head_dim = 2 * max(1, head_dim // 2)
    hidden = heads * head_dim
    model = {"name": "fuzz-model", "num_layers": draw(st.integers(1, max_layers)),
             "hidden_size": hidden, "ffn_hidden_size": draw(st.integers(1, 4 * hidden)),
             "num_heads": heads, "vocab_size": draw(st.integers(1, max_vocab)),
             "seq_len": draw(st.integers(1, max_seq)),
             "activation": draw(st.sampled_from(("gelu", "swiglu"))),
             "norm": draw(st.sampled_from(("layernorm", "rmsnorm"))),
             "tied_embeddings": draw(st.booleans()),
             "position_embedding": position,
             "dropout": draw(st.booleans())}
    if kv_heads != heads or draw(st.booleans()):
        model["num_kv_heads"] = kv_heads
    return model


@st.composite
def layouts(draw: st.DrawFn, *, heads: int = 8, kv_heads: int = 8, layers: int = 8,
            seq_len: int = 2048, wild: float = 0.2) -> list[str]:
    """`plan simulate` layout flags: mostly what the model allows (tp dividing the heads,
    pp*vp at most the layers, gbs a multiple of mbs*dp, interleaving in groups of pp), and
    with probability `wild` anything at all (the CLI decides)."""
    if draw(st.floats(0, 1)) < wild:
        tp, pp, vp, cp = (draw(st.sampled_from((1, 2, 3, 4, 8))), draw(st.integers(1, 8)),
                          draw(st.integers(1, 4)), draw(st.sampled_from((1, 2, 4))))
        dp, mbs = draw(st.integers(1, 8)), draw(st.integers(1, 8))
        gbs = draw(st.integers(1, 4096))
    else:
        tps = [t for t in (1, 2, 4, 8)
               if heads % t == 0 and (kv_heads % t == 0 or t % kv_heads == 0)]
        tp = draw(st.sampled_from(tps))
        pp = draw(st.integers(1, max(1, min(8, layers))))
        vp = draw(st.sampled_from([v for v in (1, 1, 2, 3) if pp > 1 and pp * v <= layers] or [1]))
        cp = draw(st.sampled_from([c for c in (1, 1, 2) if seq_len % (2 * c) == 0 or c == 1]))
        dp, mbs = draw(st.integers(1, 4)), draw(st.integers(1, 4))
        gbs = mbs * dp * pp * draw(st.integers(1, 8))
    flags = ["--tp", str(tp), "--pp", str(pp), "--dp", str(dp), "--mbs", str(mbs),
             "--gbs", str(gbs), "--vp", str(vp), "--cp", str(cp)]
    for flag, values in (("--seq", st.sampled_from((64, 128, 512, 2048, 4096)).map(str)),
                         ("--recompute", st.sampled_from(("none", "selective", "full"))),
                         ("--schedule", st.sampled_from(("gpipe", "1f1b", "zb-h1"))),
                         ("--sharding", st.sampled_from(("none", "zero1", "zero2", "zero3"))),
                         ("--dtype", st.sampled_from(("fp16", "fp32"))),
                         ("--method", st.sampled_from(("simulate", "estimate")))):
        if draw(st.integers(0, 3)) == 0:
            flags += [flag, draw(values)]
    if draw(st.booleans()):
        flags.append("--sequence-parallel")
    return flags


def num_gpus(layout: list[str]) -> int:
    """tp * pp * dp * cp of `layouts` flags."""
    value = {layout[i]: int(layout[i + 1]) for i in range(0, 14, 2)}  # the first 7 flags
    return value["--tp"] * value["--pp"] * value["--dp"] * value["--cp"]


@st.composite
def objectives(draw: st.DrawFn) -> list[str]:
    """--objective, --tokens and --max-budget: mostly sensible, sometimes not."""
    kind = draw(st.sampled_from(("none", "none", "time", "time", "cost", "budget", "wild")))
    tokens = ["--tokens", draw(st.sampled_from(("1e9", "3e11", "2e12")))]
    if kind == "time":
        return ["--objective", "time-to-train", *tokens]
    if kind == "cost":
        return ["--objective", "cost", *tokens]
    if kind == "budget":
        return [*tokens, "--max-budget", draw(st.sampled_from(("100", "1e6", "1e9")))]
    if kind == "none":
        return []
    flags = []
    if draw(st.booleans()):
        flags += ["--objective", draw(st.sampled_from(("throughput", "cost", "time-to-train")))]
    if draw(st.booleans()):
        flags += ["--tokens", draw(st.sampled_from(("1e9", "0", "nan", "-1", "1e30")))]
    if draw(st.booleans()):
        flags += ["--max-budget", draw(st.sampled_from(("100", "-3", "inf", "0")))]
    return flags


SCENARIO_WORDS = [
    "add {gpu} 8", "add {gpu} 16 ib-a", "remove {gpu} 8", "swap {gpu} {gpu2}",
    "scale-nic {gpu} 2", "scale-nic g0 0.5", "scale-link ib-a ib-b 4", "price {gpu} 1.5",
    "egress-price 0.02", "model debug-tiny", "model gpt3-125m", "tokens 1e10", "tokens nan",
    "add {gpu} ²", 'add "{gpu} 8', "scale-nic {gpu} 1e300",
]


@st.composite
def scenarios(draw: st.DrawFn) -> str:
    changes = draw(st.lists(st.sampled_from(SCENARIO_WORDS), min_size=1, max_size=3))
    gpu, gpu2 = draw(st.sampled_from(GPU_TYPES)), draw(st.sampled_from(GPU_TYPES))
    text = "; ".join(c.format(gpu=gpu, gpu2=gpu2) for c in changes)
    return (draw(st.sampled_from(("", "label: ", "x:"))) + text)


# --- one bounded call ---------------------------------------------------------------------

@contextlib.contextmanager
def cpu_budget(seconds: float):
    """Raise CallTooLong in this process after `seconds` of its CPU time (SIGVTALRM: not
    pytest-timeout's SIGALRM, and blind to a loaded machine's waiting)."""
    def expire(signum, frame):
        raise CallTooLong(f"more than {seconds} CPU-seconds")

    previous = signal.signal(signal.SIGVTALRM, expire)
    signal.setitimer(signal.ITIMER_VIRTUAL, seconds)
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_VIRTUAL, 0)
        signal.signal(signal.SIGVTALRM, previous)


def plan_cli(argv: list[str], capsys, *, budget_s: float) -> tuple[int, str, str]:
    """(exit code, stdout, stderr) of `plan ARGV`, within `budget_s` CPU-seconds; the
    outcome is counted in STATS."""
    start = time.process_time()
    with cpu_budget(budget_s):
        try:
            code = main(argv)
        except SystemExit as exit_:  # argparse
            code = exit_.code
        except Exception as crash:
            test = known_crash(crash)
            if test is None:
                raise
            capsys.readouterr()
            STATS[(argv[0], f"known crash ({test.rsplit('::', 1)[1]})")] += 1
            return KNOWN, "", ""
    out, err = capsys.readouterr()
    used = time.process_time() - start
    SLOWEST[argv[0]] = max(SLOWEST.get(argv[0], 0.0), used)
    STATS[(argv[0], {0: "result", 1: "no plan", 2: "refused"}.get(code, f"exit {code}"))] += 1
    if code:
        said = re.sub(r"^\S*?(\.yaml|\.json):", "FILE:", err.split("error: ")[-1].strip())
        REASONS[(argv[0], re.sub(r"'[^']*'|\d[\d,.e+-]*", "_", said)[:70])] += 1
    return code, out, err


def check_outcome(code: int, out: str, err: str, *, argv: list[str]) -> None:
    """A result, or one line and exit 2 (or "no plan", exit 1, from search)."""
    command, shown = argv[0], "plan " + " ".join(argv)
    if code == KNOWN:
        return
    if code == 0:
        assert not re.search(r"\b(nan|inf)\b", out, re.IGNORECASE), (shown, out)
        if out.startswith("{"):
            check_numbers(json.loads(out), shown=shown)
        return
    lines = err.strip().splitlines()
    if command == "export" and code == 2 and "cannot express" in err:
        # exact or refused (issue 16): one line per setting the framework cannot express
        assert all(line.startswith("plan export: ") for line in lines), (shown, err)
        assert "Traceback" not in err, (shown, err)
        return
    assert len(lines) == 1 and "Traceback" not in err, (shown, err)
    if code == 1:
        assert command in ("search", "what-if") and "no plan" in lines[0], (shown, err)
        return
    assert code == 2, (shown, code, err)
    assert lines[0].startswith(f"plan {command}: error: "), (shown, err)
    assert len(lines[0]) < 1000, (shown, lines[0])


def check_numbers(value: object, path: str = "", *, shown: str = "") -> None:
    """No NaN, no infinity anywhere; no negative time (a key ending in _s)."""
    if isinstance(value, dict):
        for key, item in value.items():
            check_numbers(item, f"{path}.{key}", shown=shown)
    elif isinstance(value, list):
        for i, item in enumerate(value):
            check_numbers(item, f"{path}[{i}]", shown=shown)
    elif isinstance(value, float | int) and not isinstance(value, bool):
        assert math.isfinite(value), (shown, path, value)
        if path.endswith("_s") or "time" in path.rsplit(".", 1)[-1]:
            assert value >= 0, (shown, path, value)



def write_yaml(path, data) -> str:
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return str(path)


def summary() -> str:
    commands = sorted({c for c, _ in STATS})
    lines = []
    for c in commands:
        parts = ", ".join(f"{o} {n}" for (cc, o), n in sorted(STATS.items()) if cc == c)
        total = sum(n for (cc, _), n in STATS.items() if cc == c)
        lines.append(f"{c}: {total} calls ({parts}); slowest {SLOWEST.get(c, 0):.1f} CPU-s")
    return "\n".join(lines)


def reasons(top: int = 40) -> str:
    """The most frequent refusals (numbers and quoted values blanked)."""
    return "\n".join(f"{n:5d} {c}: {r}" for (c, r), n in REASONS.most_common(top))
