"""Plans in words a person reads: the cells of `plan search`'s table, the sentences of the
what-if report, the glossary both point to, and tables that fit a terminal.

One place says what "ZeRO-2", "tp" or "headroom" mean, so every output uses the same
words for the same things.
"""

from __future__ import annotations

from collections.abc import Sequence

from planner.predict.results import SimResult
from planner.specs.choices import Recompute, Schedule
from planner.specs.plan import Plan, Sharding, Stage

__all__ = ["GIB", "GLOSSARY", "count_words", "duration_words", "gpu_short_names", "headroom_bytes", "is_mixed",
           "layout_cell", "plan_words",
           "recompute_words", "schedule_words",
           "render_table", "replica_lines", "shape_key", "sharding_cell", "sharding_words",
           "wrapped"]

GIB = 1024**3

# term -> what it means, in the words the outputs use (the report prints it; the search
# table's legend is a short form)
GLOSSARY = {
    "tp": "tensor parallelism: each layer's matrices are split over this many GPUs of one "
          "node, which exchange partial results inside every layer",
    "pp": "pipeline parallelism: the layers are cut into this many stages, each on its "
          "own GPUs; micro-batches flow through them",
    "dp": "data parallelism: this many replicas of the model each train on part of the "
          "batch and average their gradients",
    "cp": "context parallelism: each sequence is split over this many GPUs",
    "vp": "interleaving: each pipeline stage holds this many separate chunks of layers, "
          "which shortens the pipeline's fill and drain",
    "sp": "sequence parallelism: with tp, norms and dropouts split the sequence too, "
          "saving activation memory",
    "mbs": "micro-batch size: sequences each pipeline stage works on at a time",
    "recompute": "activation recomputation: none keeps every activation for the backward "
                 "pass; selective recomputes only the attention scores and softmax (large "
                 "activations, little compute); full recomputes whole layers, keeping only "
                 "their inputs (least memory, most compute)",
    "sharding": "how the model's training state is split over the data-parallel replicas "
                "instead of copied to each: ZeRO-1 splits the optimizer states, ZeRO-2 "
                "also the gradients, ZeRO-3 also the parameters; 'optimizer states split "
                "over 256 replicas' (in tables 'optim 256') splits only that state, over "
                "that many replicas (AMSP: each state its own group)",
    "schedule": "the order of forward and backward passes in a pipeline: 1F1B alternates "
                "them; ZB-H1 (zero bubble) defers weight gradients into the idle time; "
                "interleaved 1F1B runs several chunks per stage",
    "pipeline bubble": "time pipeline stages sit idle waiting for work at the start and end of an "
              "iteration",
    "exposed communication": "communication the GPUs wait for: what is not hidden behind "
                             "computation",
    "MFU": "model FLOPs utilisation: useful model arithmetic per second as a share of the "
           "GPUs' peak",
    "headroom": "GPU memory left free at the plan's peak: capacity less the predicted peak "
                "(memory fragmentation and other processes need some)",
}


def count_words(n: float) -> str:
    """A large count as a person says it: 1e12 -> '1 trillion', 3e11 -> '300 billion',
    2.5e9 -> '2.5 billion' (three significant digits), below a million as digits."""
    for word, scale in (("trillion", 1e12), ("billion", 1e9), ("million", 1e6)):
        if abs(n) >= scale:
            v = n / scale
            return f"{v:.3g} {word}" if abs(v) < 1000 else f"{v:,.0f} {word}"
    return f"{n:,.0f}"


def duration_words(seconds: float) -> str:
    """A time to train in the unit that shows it: days from one day, hours, minutes,
    seconds below (a 90-second run read '0.00 days')."""
    for unit, size, digits in (("days", 86400, 2), ("h", 3600, 1), ("min", 60, 1)):
        if seconds >= size:
            return f"{seconds / size:.{digits}f} {unit}"
    return f"{seconds:.3g} s"


def sharding_cell(sharding: Sharding, dp: int, *, compact: bool = False) -> str:
    """A table cell: 'none', 'ZeRO-1/2/3' where it is one of those over the `dp` ranks
    holding the same parameters (dp x cp: `Plan.dp_cp`), else which states are split over
    how many of them ('grads 8, optim 256'; `compact`: 'G8 OS256', AMSP's P/G/OS
    notation, for a table that must fit a terminal)."""
    sizes = (sharding.params, sharding.grads, sharding.optim)
    if dp > 1:
        named = {(1, 1, 1): "none", (1, 1, dp): "ZeRO-1", (1, dp, dp): "ZeRO-2",
                 (dp, dp, dp): "ZeRO-3"}
        if sizes in named:
            return named[sizes]
    elif sizes == (1, 1, 1):
        return "none"
    names = ("P", "G", "OS") if compact else ("params ", "grads ", "optim ")
    parts = [f"{name}{size}" for name, size in zip(names, sizes, strict=True) if size > 1]
    return (" " if compact else ", ").join(parts)


def sharding_words(plan: Plan) -> str:
    """A clause for a report: how the plan splits its training state."""
    dp, what = plan.dp_cp, "replicas" if plan.dp_cp == plan.dp else "data x context ranks"
    if plan.stage_sharding:
        return "training state split per stage: " + "; ".join(
            f"stage {k}: {_sharding_phrase(sh, dp, what)}"
            for k, sh in enumerate(plan.stage_sharding))
    return _sharding_phrase(plan.sharding, dp, what)


def _sharding_phrase(sh: Sharding, dp: int, what: str = "replicas") -> str:
    if (sh.params, sh.grads, sh.optim) == (1, 1, 1):
        return "training state copied to every replica (no sharding)"
    cell = sharding_cell(sh, dp)
    if cell.startswith("ZeRO"):
        return f"{cell} over all {dp} {what}"
    states = [(name, size) for name, size in (("optimizer states", sh.optim),
                                               ("gradients", sh.grads),
                                               ("parameters", sh.params)) if size > 1]
    return "; ".join(f"{name} split over {size} {what}" for name, size in states)


def recompute_words(recompute: Recompute | str) -> str:
    return {Recompute.NONE: "no recomputation", Recompute.SELECTIVE:
            "selective recomputation (attention)", Recompute.FULL:
            "full recomputation"}[Recompute(recompute)]


def schedule_words(plan: Plan) -> str:
    """The pipeline schedule in words (nothing for a plan without a pipeline)."""
    tr = plan.training
    if max(len(p.stages) for p in plan.pipelines) == 1:
        return ""
    if tr.virtual_stages > 1:
        return f"interleaved 1F1B schedule ({tr.virtual_stages} chunks per stage)"
    return {Schedule.ONE_F_ONE_B: "1F1B schedule", Schedule.GPIPE: "GPipe schedule",
            Schedule.ZB_H1: "zero-bubble schedule (ZB-H1)"}.get(tr.schedule, f"{tr.schedule}")


def plan_words(plan: Plan) -> str:
    """The whole plan in a sentence: its replicas and stages, micro-batches, schedule,
    recomputation and sharding, e.g. '32 replicas, each 4 pipeline stages: A100 tp2 x2
    (10/10 layers) -> V100 tp2 x2 (10/10); micro-batches of 1 sequence; zero-bubble
    schedule (ZB-H1); no recomputation; optimizer states split over 32 replicas'."""
    kinds: dict[tuple[str, int], int] = {}
    for pipe in plan.pipelines:
        key = (_stages_words(plan, pipe.stages), len(pipe.stages))
        kinds[key] = kinds.get(key, 0) + 1
    parts = []
    for (stages, pp), n in kinds.items():
        what = f"{pp} pipeline stages" if pp > 1 else "one stage"
        parts.append(f"{n} replica{'s' if n > 1 else ''}, each {what}: {stages}")
    mbs = sorted({p.micro_batch_size for p in plan.pipelines})
    words = [" + ".join(parts),
             f"micro-batches of {'/'.join(map(str, mbs))} sequence{'s' if max(mbs) > 1 else ''}"]
    if plan.training.sequence_parallel:
        words.append("sequence parallel")
    tr = plan.training
    if tr.ep > 1:
        etp = f", expert tp {tr.etp}" if tr.etp else ""
        where = (f", one tp rank in each of {tr.ep} replicas"
                 if tr.ep_layout == "data_parallel" else "")
        words.append(f"experts split over {tr.ep} ranks (expert parallel{etp}{where})")
    words += [schedule_words(plan), recompute_words(plan.pipelines[0].stages[0].recompute),
              sharding_words(plan)]
    return "; ".join(w for w in words if w)


def _stages_words(plan: Plan, stages: Sequence[Stage]) -> str:
    runs: list[tuple[str, list[int]]] = []
    short = gpu_short_names(plan)
    for s in stages:
        cp = f" cp{s.cp}" if s.cp > 1 else ""
        what = f"{short[_stage_gpu(plan, s.devices)]} tp{s.tp}{cp}"
        if runs and runs[-1][0] == what:
            runs[-1][1].append(s.num_layers)
        else:
            runs.append((what, [s.num_layers]))
    return " -> ".join(f"{what}{f' x{len(ls)}' if len(ls) > 1 else ''} "
                       f"({'/'.join(map(str, ls))}{' layers' if k == 0 else ''})"
                       for k, (what, ls) in enumerate(runs))


def gpu_short_names(plan: Plan) -> dict[str, str]:
    """Each GPU type of the plan's cluster by the fewest leading words of its name (split
    at '-') that tell it from the others: 'A100' alone, 'A100-80GB-SXM' and
    'A100-80GB-PCIe' beside each other."""
    names = sorted({g.gpu for g in plan.cluster.node_groups})
    out = {}
    for name in names:
        words = name.split("-")
        for n in range(1, len(words) + 1):
            prefix = "-".join(words[:n])
            if not any(o != name and "-".join(o.split("-")[:n]) == prefix for o in names):
                break
        out[name] = prefix
    return out


def _stage_gpu(plan: Plan, devices: Sequence[int]) -> str:
    c = plan.cluster
    return c.group_of(devices[0]).gpu


def layout_cell(plan: Plan) -> str:
    """'tp4+sp pp2 dp64' (cp, vp where used, a schedule other than 1F1B after pp); a
    mixed plan gives its depth and replicas and `replica_lines` the stages."""
    tr = plan.training
    tps = {s.tp for p in plan.pipelines for s in p.stages}
    cps = {s.cp for p in plan.pipelines for s in p.stages}
    gpus = {_stage_gpu(plan, s.devices) for p in plan.pipelines for s in p.stages}
    pps = sorted({len(p.stages) for p in plan.pipelines})
    sp = "+sp" if tr.sequence_parallel and max(tps) > 1 else ""
    pp = "/".join(map(str, pps))
    if len(tps) == 1 and len(gpus) == 1:
        text = f"tp{tps.pop()}{sp}"
    else:
        text = "tp" + "/".join(map(str, sorted(tps))) + sp + " mixed"
    if cps != {1}:
        text += " cp" + "/".join(map(str, sorted(cps)))
    text += f" pp{pp}"
    if tr.virtual_stages > 1:  # interleaved 1F1B
        text += f" vp{tr.virtual_stages}"
    elif tr.schedule != Schedule.ONE_F_ONE_B and max(pps) > 1:
        text += f" {tr.schedule}"
    return text + f" dp{plan.dp}" + (f" ep{tr.ep}" if tr.ep > 1 else "")


def replica_lines(plan: Plan, width: int = 94) -> list[str]:
    """Each kind of replica: how many, its stages in order (consecutive stages alike as
    one run: GPU type, tp, how many stages, the layers of each) and its micro-batches, e.g.
    '32x  A100 tp4 x2 (14/14 layers) -> H100 tp2 (8) -> V100 tp4 (44); 8 micro-batches of
    1', wrapped to `width` columns."""
    kinds: dict[str, int] = {}
    for pipe in plan.pipelines:
        m = pipe.num_microbatches
        text = (_stages_words(plan, pipe.stages) + f"; {m} micro-batch{'es' if m > 1 else ''}"
                f" of {pipe.micro_batch_size}")
        kinds[text] = kinds.get(text, 0) + 1
    out = []
    for text, n in kinds.items():
        out += wrapped(f"{n}x {text}", width=width, indent="    ")
    return out


def is_mixed(plan: Plan) -> bool:
    """Whether stages differ in GPU type or tensor parallelism."""
    seen = {(_stage_gpu(plan, s.devices), s.tp, s.cp) for p in plan.pipelines for s in p.stages}
    return len(seen) > 1


def shape_key(plan: Plan) -> tuple:
    """What makes two plans different layouts, beyond their GPU count: how each kind of
    replica cuts its GPUs (stages in order, each its GPU type, tp and cp). Plans of one
    shape differ only in how many replicas they run, their batch, schedule, recompute or
    sharding."""
    return (*sorted({tuple((_stage_gpu(plan, s.devices), s.tp, s.cp) for s in p.stages)
                     for p in plan.pipelines}), plan.training.ep)


def headroom_bytes(result: SimResult) -> float:
    """Memory left free on the tightest GPU at the plan's peak (capacity less peak)."""
    return min(s.memory.capacity_bytes - s.memory.total_bytes for s in result.stages)


def wrapped(text: str, width: int = 100, indent: str = "  ") -> list[str]:
    """`text` in lines of at most `width` characters, the later ones indented."""
    import textwrap

    return textwrap.wrap(text, width=width, subsequent_indent=indent,
                         break_on_hyphens=False) or [""]


def render_table(headers: Sequence[str], rows: Sequence[Sequence[str]], *,
                 right: Sequence[bool], width: int | None = None,
                 optional: Sequence[int] = (), notes: Sequence[Sequence[str]] = ()
                 ) -> list[str]:
    """Columns as wide as their widest cell, two spaces apart; while wider than `width`
    the columns in `optional` are dropped (in that order). `notes[i]` are lines printed
    under row i, indented."""
    keep = list(range(len(headers)))

    def widths() -> list[int]:
        return [max([len(headers[c])] + [len(r[c]) for r in rows]) for c in keep]

    for c in optional:
        if width is None or sum(widths()) + 2 * (len(keep) - 1) <= width:
            break
        keep.remove(c)
    ws = widths()

    def line(cells: Sequence[str]) -> str:
        out = [cells[c].rjust(w) if right[c] else cells[c].ljust(w) for c, w in zip(keep, ws,
                                                                                    strict=True)]
        return "  ".join(out).rstrip()

    lines = [line(headers)]
    for i, r in enumerate(rows):
        lines.append(line(r))
        lines.extend("      " + n for n in (notes[i] if i < len(notes) else ()))
    return lines
