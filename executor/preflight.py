"""Plans the executor cannot run here are refused before any process starts.

Pure Python (no torch): each check raises a SpecError naming the plan field, the value
and what is allowed, which `plan run` prints as one line (exit 2). `Plan.check` already
holds the plan together (stages cover all layers in order, GPU indices exist and are used
once, the batch adds up); these are the executor's own limits and this host's.
"""

from __future__ import annotations

from planner.costs.kernels import supported_attention
from planner.export.frameworks import mixed_tp_sharding_runs, model_states_differ
from planner.specs.choices import DEFAULT_RECOMPUTE_MODULES, DType, ModelStates, Recompute
from planner.specs.model import ModelSpec
from planner.specs.plan import Plan
from planner.specs.rules import require, seq_problem
from profiler.kernels import SDPA_BACKENDS
from profiler.schema import at, fail

__all__ = ["check_model", "check_runnable", "device_kind"]


def device_kind(plan: Plan) -> str:
    """"cpu" when the plan's ranks are CPU cores, "cuda" when they are GPUs."""
    kinds = {"cpu" if g.device.vendor == "cpu" else "cuda" for g in plan.cluster.node_groups}
    if len(kinds) > 1:
        fail("plan.cluster.node_groups", sorted(g.gpu for g in plan.cluster.node_groups),
             "CPU ranks and GPUs in one run")
    return kinds.pop()


def _check_host(plan: Plan, kind: str, cuda_devices: int, where: str) -> None:
    if kind != "cuda":
        return
    if cuda_devices == 0:
        gpus = ", ".join(sorted({g.gpu for g in plan.cluster.node_groups}))
        fail(at(where, "cluster"), plan.cluster.name, f"it runs on {gpus} GPUs and this host "
             "has no CUDA device; plan for CPU ranks (cluster_specs/local-cpu.yaml)")
    slots = plan.cluster.slots
    per_node: dict[int, int] = {}
    for d in (d for p in plan.pipelines for s in p.stages for d in s.devices):
        per_node[slots[d].node] = max(per_node.get(slots[d].node, 0), slots[d].local + 1)
    node, need = max(per_node.items(), key=lambda kv: kv[1])
    if need > cuda_devices:
        fail(at(where, "pipelines"), f"GPU {need - 1} of node {node}",
             f"a node of this host has {cuda_devices} GPUs")


def _check_replicas(plan: Plan, where: str) -> None:
    """Data parallelism here syncs stage position s of every replica: the same layers.
    Where the replicas' tp differs at a position (executor/mixed_tp.py), whole gradients
    are summed there, without model-state sharding or with ZeRO-1 over all replicas."""
    first = plan.pipelines[0].stages
    for pi, pipe in enumerate(plan.pipelines[1:], 1):
        if [s.layers for s in pipe.stages] != [s.layers for s in first]:
            fail(at(where, f"pipelines[{pi}].stages"), [list(s.layers) for s in pipe.stages],
                 "the executor needs every replica to split the layers at the same "
                 f"boundaries as pipelines[0] ({[list(s.layers) for s in first]})")
    for si in range(len(first)):
        tps = [p.stages[si].tp for p in plan.pipelines]
        if len(set(tps)) == 1:
            continue
        sh = plan.sharding_of(si)
        if not mixed_tp_sharding_runs(sh, plan.dp):
            fail(at(where, "stage_sharding" if plan.stage_sharding else "sharding"),
                 f"P/G/OS {sh.params}/{sh.grads}/{sh.optim} at stage position {si}",
                 f"the replicas' tp differs there ({tps}); the executor runs mixed tp "
                 f"without model-state sharding or with ZeRO-1 over all {plan.dp} replicas "
                 f"(P/G/OS 1/1/1 or 1/1/{plan.dp} at that position)")


def _check_stages(plan: Plan, where: str) -> None:
    for pi in range(len(plan.pipelines)):
        _check_pipeline_stages(plan, pi, where)


def _check_pipeline_stages(plan: Plan, pi: int, where: str) -> None:
    m, tr = plan.model, plan.training
    stages = plan.pipelines[pi].stages
    for si, s in enumerate(stages):
        path = at(where, f"pipelines[{pi}].stages[{si}]")
        if s.cp > 1:
            fail(at(path, "cp"), s.cp, "context parallelism is not implemented by the "
                 "executor (cp = 1)")
        if m.kv_heads % s.tp:
            fail(at(path, "tp"), s.tp, f"must divide num_kv_heads {m.kv_heads} (the executor "
                 "does not replicate K/V heads)")
        nxt = stages[(si + 1) % len(stages)]
        if tr.sequence_parallel and nxt.tp != s.tp and (si + 1 < len(stages) or tr.virtual_stages > 1):
            fail(at(path, "tp"), s.tp, f"sequence parallelism needs equal tp on neighbouring "
                 f"stages (the next has {nxt.tp})")
    if (tr.embedding_in_pipeline_split or tr.loss_in_pipeline_split) and tr.virtual_stages > 1:
        fail(at(where, "training.embedding_in_pipeline_split"), True,
             "the executor splits each stage's interleaved chunks by layers (the embedding "
             "and the loss do not take a layer's place; vp = 1 or neither setting)")
    if tr.pipeline_flushes > 1:
        fail(at(where, "training.pipeline_flushes"), tr.pipeline_flushes,
             "1 (the executor runs a step's micro-batches as one schedule)")
    if any(s.num_layers == 0 for s in stages):
        fail(at(where, f"pipelines[{pi}].stages"), [list(s.layers) for s in stages],
             "the executor runs stages of at least one layer (no embedding- or head-only "
             "stage)")
    if m.tied_embeddings and len(stages) > 1 and stages[0].tp != stages[-1].tp:
        fail(at(where, f"pipelines[{pi}].stages"), [s.tp for s in stages],
             "tied embeddings need the same tp on the first and the last stage")


def _check_schedule(plan: Plan, where: str) -> None:
    tr = plan.training
    pp = len(plan.pipelines[0].stages)
    if tr.schedule.splits_backward:
        _check_zero_bubble(plan, where)
    # micro-batches in multiples of the stages: Plan.check (the simulator needs it too)
    if tr.virtual_stages > 1 and pp == 1:
        fail(at(where, "training.virtual_stages"), tr.virtual_stages,
             "interleaving needs more than one stage")


def _check_zero_bubble(plan: Plan, where: str) -> None:
    """ZB-H1 splits every stage's backward but the first into B and W (executor/pipeline.py);
    W is a second autograd pass, in which torch.utils.checkpoint would run each layer's
    forward again (the simulator prices one recomputation)."""
    for pi, pipe in enumerate(plan.pipelines):
        for si, s in enumerate(pipe.stages[1:], 1):
            if s.recompute == Recompute.FULL:
                fail(at(where, f"pipelines[{pi}].stages[{si}].recompute"), "full",
                     "zb-h1 computes weight gradients in a second backward pass, which would "
                     "recompute each layer again; allowed: none, selective (full on stage 0)")


def _check_recompute_modules(plan: Plan, where: str) -> None:
    """Selective recomputation here re-runs the attention core (executor/model.py)."""
    modules = plan.training.recompute_modules
    selective = any(s.recompute == Recompute.SELECTIVE for p in plan.pipelines for s in p.stages)
    if selective and modules != DEFAULT_RECOMPUTE_MODULES:
        fail(at(where, "training.recompute_modules"), [str(m) for m in modules],
             "the executor's selective recomputation re-runs the attention core only "
             "(core_attn)")


def check_model(m: ModelSpec, where: str) -> None:
    """Refuse a model the executor cannot build: its blocks run ordinary (grouped-query)
    attention (executor/model.py)."""
    if m.is_mla:
        fail(at(where, "kv_lora_rank"), m.kv_lora_rank,
             f"model {m.name} uses multi-head latent attention, which the executor does not "
             "implement (latent down/up-projections, decoupled rotary key); it runs "
             "ordinary attention only (kv_lora_rank none)")


def _check_kernels(plan: Plan, kind: str, where: str) -> None:
    m, tr = plan.model, plan.training
    if not m.lm_head:
        fail(at(where, "model.lm_head"), False, "the executor's models end in an output "
             "projection")
    if m.position_embedding == "alibi":
        fail(at(where, "model.position_embedding"), "alibi",
             "the executor model has learned and rope positions")
    # every rank died on its embedding with a traceback (sweep of 2026-12-03)
    require(at(where, "training.seq_len"), tr.seq_len, seq_problem(m, tr.seq_len))
    if tr.dtype == "fp8":
        fail(at(where, "training.dtype"), "fp8", "the executor has no FP8 GEMMs; use bf16 "
             "(fp16 where a GPU lacks bf16), or export an fp8 plan to Megatron-Core "
             "(plan search --framework megatron)")
    for pi, pipe in enumerate(plan.pipelines):
        for si, stage in enumerate(pipe.stages):
            dev = plan.group_of(stage).device
            attention = plan.attention_of(stage)
            path = (at(where, f"pipelines[{pi}].stages[{si}].attention") if stage.attention
                    else at(where, "kernels.attention"))
            if attention not in supported_attention(dev, tr.dtype):
                fail(path, attention, f"{dev.name} runs "
                     f"{', '.join(supported_attention(dev, tr.dtype))} in {tr.dtype}")
            if attention not in SDPA_BACKENDS:
                fail(path, attention, f"the executor runs {', '.join(sorted(SDPA_BACKENDS))} "
                     "(PyTorch's scaled_dot_product_attention backends)")
            if attention.fused and m.drops_attention and kind == "cpu":
                fail(path, attention, "fused attention with dropout does not run on the CPU "
                     "(use math)")


def _check_moe(plan: Plan, where: str) -> None:
    """The executor's MoE layer (executor/moe.py) runs alone, with dp, pp, tp (experts
    whole on every tp rank: etp 1, no sequence parallelism) and expert parallelism over
    data-parallel ranks (as the plan must say where that is not Megatron's folding:
    `Training.ep_layout`), ep only where the ep peers run the same passes in the
    same order (their all-to-alls pair up) and shard expert states in whole numbers. In a
    mixed plan the ep peers of a stage position hold its layers (every replica splits the
    layers alike: `_check_replicas`) and split them alike (one tp at the position)."""
    m, tr = plan.model, plan.training
    if not m.is_moe:
        return
    tps = sorted({s.tp for p in plan.pipelines for s in p.stages})
    if tps != [1] and tr.etp != 1:
        fail(at(where, "training.etp"), tr.etp if tr.etp is not None else f"{tps[-1]} (tp)",
             "the executor's MoE layer keeps its experts whole on every tp rank: with "
             "tp > 1 set etp 1 (expert tp = tp is not implemented)")
    if tps != [1] and tr.sequence_parallel:
        fail(at(where, "training.sequence_parallel"), True, "the executor's MoE layer runs "
             "on the whole sequence: no sequence parallelism on MoE models")
    if tr.ep == 1:
        return
    if tr.comm.moe_dispatcher != "alltoall":
        fail(at(where, "training.comm.moe_dispatcher"), tr.comm.moe_dispatcher,
             "alltoall (the executor dispatches tokens with all_to_all_single, executor/"
             "moe.py; a plan priced with DeepEP's dispatch would be measured against "
             "another)")
    if plan.dp % tr.ep:
        fail(at(where, "training.ep"), tr.ep, f"the executor's ep groups are data-parallel "
             f"ranks: ep must divide dp {plan.dp} (folding tp or cp into ep is not "
             "implemented)")
    for si in range(len(plan.pipelines[0].stages)):
        tps = [p.stages[si].tp for p in plan.pipelines]
        if len(set(tps)) > 1:
            fail(at(where, "pipelines"), f"tp {tps} at stage position {si}",
                 f"with ep {tr.ep} every replica needs the same tp at a stage position: "
                 "an ep group is rank t of the position in ep replicas (executor/topology.py "
                 "`ep_group`), and mixed tp sums whole gradients without an expert bucket "
                 "(executor/mixed_tp.py)")
    counts = sorted({(p.num_microbatches, p.micro_batch_size) for p in plan.pipelines})
    if len(counts) > 1:
        fail(at(where, "pipelines"), [list(c) for c in counts], "expert parallelism needs "
             "every replica to run the same micro-batches (count, size): ep peers trade "
             "tokens in every pass")
    if tr.schedule.splits_backward:
        fail(at(where, "training.schedule"), tr.schedule.value, "zb-h1 with ep > 1 is not "
             "implemented by the executor (its W pass would repeat the expert all-to-alls)")
    for pi, pipe in enumerate(plan.pipelines):
        for si, s in enumerate(pipe.stages):
            if s.recompute == Recompute.FULL:
                fail(at(where, f"pipelines[{pi}].stages[{si}].recompute"), "full",
                     "full recomputation with ep > 1 is not implemented by the executor "
                     "(allowed: none, selective)")
    for si, sh in enumerate(plan.shardings):
        for kind, n in (("params", sh.params), ("grads", sh.grads), ("optim", sh.optim)):
            if n > tr.ep and n % tr.ep:
                fail(at(where, "stage_sharding" if plan.stage_sharding else "sharding"),
                     f"{kind} {n} at stage position {si}", f"with ep {tr.ep} the executor "
                     "shards expert states over dp/ep ranks: each sharding degree must be "
                     f"at most ep or a multiple of it")
    folds = max(tr.ep_layout.folded_ranks(tp=s.tp, cp=s.cp, etp=tr.etp)
                for p in plan.pipelines for s in p.stages)
    if folds > 1:
        fail(at(where, "training.ep_layout"), tr.ep_layout, "data_parallel: the executor "
             "forms each ep group of one tp rank in ep data-parallel replicas "
             "(executor/topology.py `ep_group`), where the folded layout takes "
             f"{folds} ranks of each replica's stage (tp / etp x cp) and is priced so")


def _check_comm(plan: Plan, where: str) -> None:
    """The executor communicates as `Communication.preset("trainplan")` says
    (non-blocking pipeline sends, fp32 gradients reduced once per iteration after the
    last backward) and keeps fp32 master weights and fp32 gradients beside 16-bit weights
    (executor/precision.py, `ModelStates.FP32_GRADS`). Blocking sends and 16-bit
    reductions describe other frameworks for prediction; a plan priced with the
    reduction overlapped (Megatron-LM's) runs, slower than priced where its gradients
    span several buckets."""
    tr = plan.training
    if not tr.master_weights and DType(tr.dtype).master_weights:
        fail(at(where, "training.master_weights"), False,
             "true (the executor keeps fp32 master weights, gradients and Adam moments "
             "beside the 16-bit weights)")
    if tr.model_states is not ModelStates.FP32_GRADS and model_states_differ(plan):
        fail(at(where, "training.model_states"), str(tr.model_states),
             "fp32_grads (the executor keeps fp32 gradients beside the 16-bit weights; "
             "the plan was priced with less memory than a run of it holds)")
    comm = tr.comm
    if comm.pipeline_p2p.blocks_compute:
        fail(at(where, "training.comm.pipeline_p2p"), comm.pipeline_p2p,
             "the executor's pipeline sends are non-blocking (batched)")
    if comm.grad_reduce_dtype != "fp32":
        fail(at(where, "training.comm.grad_reduce_dtype"), comm.grad_reduce_dtype,
             "the executor reduces gradients in fp32")


def check_runnable(plan: Plan, *, cuda_devices: int, where: str = "plan:",
                   host: bool = True) -> None:
    """Refuse what the executor cannot run, or (with `host`) what this host cannot
    (`cuda_devices` GPUs); `plan run --dry-run` checks the plan alone."""
    kind = device_kind(plan)
    if host:
        _check_host(plan, kind, cuda_devices, where)
    check_model(plan.model, at(where, "model"))
    _check_replicas(plan, where)
    _check_stages(plan, where)
    _check_schedule(plan, where)
    _check_recompute_modules(plan, where)
    _check_kernels(plan, kind, where)
    _check_moe(plan, where)
    _check_comm(plan, where)
