"""A Plan in the configuration language of the frameworks people train with.

Each exporter renders the plan's settings in the framework's terms and lists, one line
each, what the framework (at the version `planner/export/frameworks.py` names) cannot
express; `plan export` writes the text only when that list is empty. Tests load every
config with the framework's own parser (tests/planner/export/test_frameworks_*.py).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass, fields

from planner.export.frameworks import (
    CAPABILITIES,
    PlanShape,
    distributed_optimizer_instances,
    plan_chunk_counts,
    plan_shape,
    tp_overlap_prices,
    unsupported,
)
from planner.specs.choices import DEFAULT_RECOMPUTE_MODULES, Recompute, Schedule
from planner.specs.model import ModelSpec, preset
from planner.specs.plan import Communication, Plan

__all__ = ["CONFIG_FILES", "Export", "FORMATS", "export_plan", "megatron_args"]


@dataclass(frozen=True)
class Export:
    text: str
    unsupported: tuple[str, ...]  # empty: the text is the plan exactly
    # what the user must do beside the config for it to run the plan (said on stderr)
    notes: tuple[str, ...] = ()


# the file each framework reads its config from (the launch files write it there)
CONFIG_FILES = {"megatron": "megatron_args.sh", "deepspeed": "ds_config.json",
                "torchtitan": "config.toml", "trainplan": "plan.yaml"}


def megatron_args(plan: Plan) -> list[str]:
    """Megatron-LM's pretrain_gpt.py arguments for the plan (flag and value one item)."""
    s, m, tr = plan_shape(plan), plan.model, plan.training
    args = [
        f"--num-layers {m.num_layers}", f"--hidden-size {m.hidden_size}",
        f"--ffn-hidden-size {m.ffn_hidden_size}", f"--num-attention-heads {m.num_heads}",
        f"--seq-length {tr.seq_len}", f"--max-position-embeddings {max(tr.seq_len, m.seq_len)}",
        f"--tensor-model-parallel-size {s.tp}", f"--pipeline-model-parallel-size {s.pp}",
        f"--context-parallel-size {s.cp}", f"--micro-batch-size {s.mbs}",
        f"--global-batch-size {tr.global_batch_size}",
    ]
    # fp8: Transformer Engine's FP8 GEMMs with delayed per-tensor scaling (e4m3 forward,
    # e5m2 gradients: "hybrid"), bf16 elsewhere, as DType.FP8 prices it
    # fp16: fp32 main gradients, as the plan prices them (ModelStates.FP32_GRADS), which
    # Megatron-LM's arguments.py turns on by itself for bf16 only; the DDP config's
    # grad_reduce_in_fp32 (distributed/distributed_data_parallel.py: main grads in the
    # parameters' dtype without it)
    # tf32: fp32 arguments; whether matmuls run in TF32 is the container's setting, not an
    # argument, so `unsupported` lists the dtype and --approximate writes fp32
    args += {"bf16": ["--bf16"], "fp16": ["--fp16", "--accumulate-allreduce-grads-in-fp32"],
             "fp32": [], "tf32": [],
             "fp8": ["--bf16", "--fp8-format hybrid", "--transformer-impl transformer_engine"]
             }[tr.dtype]
    if tr.fp8_params:
        # FP8 primary weights, as the plan prices their memory (Training.fp8_params):
        # Megatron-LM's --fp8-param-gather ("keep the compute param in fp8 ... and perform
        # the param all-gather in fp8"; TransformerConfig.fp8_param)
        args.append("--fp8-param-gather")
    if m.kv_heads != m.num_heads:
        args += ["--group-query-attention", f"--num-query-groups {m.kv_heads}"]
    if m.attention_head_dim is not None:
        args.append(f"--kv-channels {m.attention_head_dim}")
    args += _megatron_mla(plan)
    args += _megatron_moe(plan)
    if m.activation == "swiglu":
        args.append("--swiglu")
    args.append(f"--normalization {'RMSNorm' if m.norm == 'rmsnorm' else 'LayerNorm'}")
    args.append("--position-embedding-type "
                + {"rope": "rope", "learned": "learned_absolute"}.get(m.position_embedding,
                                                                     m.position_embedding))
    if m.position_embedding == "rope":
        # always written (Megatron-LM's default is 10000; Llama 3's is 500000): an integer
        # argument (arguments.py: --rotary-base, type=int)
        args.append(f"--rotary-base {round(m.rope_theta)}")
    if not m.tied_embeddings:
        args.append("--untie-embeddings-and-output-weights")
    # The planner prices linear layers without biases (ModelSpec counts none); Megatron adds
    # them unless told, and refuses biased experts under expert tensor parallelism
    # (TransformerConfig: "Bias in Moe is only supported when ETP==1").
    args.append("--disable-bias-linear")
    if not m.drops_attention:
        args.append("--attention-dropout 0")
    if not m.dropout:
        args.append("--hidden-dropout 0")
    args += _megatron_pipeline(plan, s)
    if tr.sequence_parallel:
        args.append("--sequence-parallel")
    recompute = s.recompute[0]
    if recompute == Recompute.FULL:
        args += ["--recompute-granularity full", "--recompute-method uniform",
                 "--recompute-num-layers 1"]
    elif recompute == Recompute.SELECTIVE:
        args.append("--recompute-granularity selective")
        if tr.recompute_modules != DEFAULT_RECOMPUTE_MODULES:
            args.append("--recompute-modules " + " ".join(tr.recompute_modules))
    backends = {"flash": "flash", "math": "unfused"}
    if m.is_mla:  # Transformer Engine turns FlashAttention off when d_qk != d_v ("does not
        # support MLA", attention/dot_product_attention/utils.py get_attention_backend);
        # cuDNN's fused attention takes MLA's widths
        backends["flash"] = "fused"
    args.append("--attention-backend " + backends.get(plan.kernels.attention, "auto"))
    ranks = s.dp * s.cp  # the distributed optimizer's dp x cp group
    instances = distributed_optimizer_instances(plan.sharding, ranks)
    if instances:
        args.append("--use-distributed-optimizer")
        if instances > 1:  # partial distributed optimizer: dp x cp / optim instances
            args.append(f"--num-distributed-optimizer-instances {instances}")
    return args + _megatron_comm(plan, ranks)


def _megatron_comm(plan: Plan, ranks: int) -> list[str]:
    """The communication as the plan prices it (`Training.comm`): the gradient reduction
    overlapped with the backward, which Megatron-Core's DistributedDataParallelConfig
    leaves off unless asked (overlap_grad_reduce False), the bucket size where the plan
    sets one (bucket_size None is the max(4e7, 1e6 x dp) the plan prices otherwise), and
    the tp collectives under the GEMMs where that prices the plan."""
    comm, args = plan.training.comm, []
    if ranks > 1 and comm.overlap_grad_reduce:
        args.append("--overlap-grad-reduce")
    if comm.tp_comm_overlap and tp_overlap_prices(plan):
        # Transformer Engine's userbuffer overlap of the sequence-parallel collectives,
        # which the plan was priced with (Megatron-LM's default is off)
        args.append("--tp-comm-overlap")
    if ranks > 1 and comm.grad_bucket_params is not None:
        args.append(f"--ddp-bucket-size {round(comm.grad_bucket_params)}")
    return args


def _megatron_mla(plan: Plan) -> list[str]:
    """Megatron-Core's multi-latent attention (MLATransformerConfig; Megatron-LM
    arguments.py): the latent ranks (no --q-lora-rank: a full-rank query), the head
    widths, and --qk-layernorm for the latents' norms (the up-projections become
    TELayerNormColumnParallelLinear, gpt_layer_specs.py)."""
    m = plan.model
    if not m.is_mla:
        return []
    args = ["--multi-latent-attention"]
    if m.q_lora_rank is not None:
        args.append(f"--q-lora-rank {m.q_lora_rank}")
    return args + [f"--kv-lora-rank {m.kv_lora_rank}", f"--qk-head-dim {m.qk_nope_head_dim}",
                   f"--qk-pos-emb-head-dim {m.qk_rope_head_dim}",
                   f"--v-head-dim {m.v_head_dim}", "--qk-layernorm"]


def _megatron_moe(plan: Plan) -> list[str]:
    """Megatron-Core's MoE flags (megatron/core/transformer/moe/README.md): the experts,
    the layer pattern as a list expression, the all-to-all dispatcher with grouped GEMMs,
    and the capacity factor when tokens are dropped (dropless otherwise)."""
    m = plan.model
    if not m.is_moe:
        return []
    args = [f"--num-experts {m.num_experts}", f"--moe-router-topk {m.experts_per_token}",
            f"--moe-ffn-hidden-size {m.expert_ffn}",
            f"--expert-model-parallel-size {plan.training.ep}",
            f"--expert-tensor-parallel-size {plan.training.etp or plan_shape(plan).tp}",
            "--moe-grouped-gemm"]
    if plan.training.comm.moe_dispatcher == "deepep":  # MoE README: flex + the DeepEP backend
        args += ["--moe-token-dispatcher-type flex", "--moe-flex-dispatcher-backend deepep"]
    else:
        args.append("--moe-token-dispatcher-type alltoall")
    if m.num_shared_experts:
        args.append(f"--moe-shared-expert-intermediate-size {m.shared_ffn}")
    if m.first_k_dense or m.moe_layer_freq > 1:
        pattern = [int(m.is_moe_layer(i)) for i in range(m.num_layers)]
        args.append(f"--moe-layer-freq {_list_expression(pattern)}")
    if m.router == "sigmoid":
        args.append("--moe-router-score-function sigmoid")
    # load balancing: Megatron's aux-loss coefficient defaults to 0 (no balancing at all,
    # while the plan prices `load_imbalance`); a softmax router gets the auxiliary loss at
    # the starting value arguments.py's help recommends (1e-2), a sigmoid one DeepSeek-V3's
    # auxiliary-loss-free expert bias with its sequence-wise loss (Megatron-LM's
    # examples/post_training/modelopt/conf/deepseek-ai/DeepSeek-R1.sh)
    if m.router == "sigmoid":
        args += ["--moe-router-enable-expert-bias", "--moe-router-bias-update-rate 1e-3",
                 "--moe-router-load-balancing-type seq_aux_loss", "--moe-aux-loss-coeff 1e-4"]
    else:
        args += ["--moe-router-load-balancing-type aux_loss", "--moe-aux-loss-coeff 1e-2"]
    if m.capacity_factor is not None:
        args.append(f"--moe-expert-capacity-factor {m.capacity_factor:g}")
    if m.pad_to_capacity:
        args.append("--moe-pad-expert-input-to-capacity")
    return args


def _list_expression(pattern: list[int]) -> str:
    """[0, 0, 1, 1, 1] as Megatron's run-length list expression "([0]*2+[1]*3)"."""
    runs: list[list[int]] = []
    for v in pattern:
        if runs and runs[-1][0] == v:
            runs[-1][1] += 1
        else:
            runs.append([v, 1])
    return "(" + "+".join(f"[{v}]*{n}" for v, n in runs) + ")"


def _megatron_pipeline(plan: Plan, s: PlanShape) -> list[str]:
    """Interleaving and the layer split: the plain flags when Megatron's own even split is
    the plan's, else the explicit --pipeline-model-parallel-layout (E embedding, t a
    transformer layer, L the loss; virtual stages in model order, '|' between them; the
    embedding or the loss alone where the split counts them as layers)."""
    chunks = plan_chunk_counts(plan)
    if len(set(chunks)) == 1:
        return ([f"--num-layers-per-virtual-pipeline-stage {chunks[0]}"] if s.vp > 1 else [])
    parts = [f"t*{n}" if n else "" for n in chunks]
    parts[0], parts[-1] = "E" + parts[0], parts[-1] + "L"
    return [f"--pipeline-model-parallel-layout {'|'.join(parts)}"]


_MEGATRON_LIST_FLAGS = ("--recompute-modules ",)


def _megatron(plan: Plan) -> Export:
    issues = unsupported(plan, CAPABILITIES["megatron"])
    m = plan.model
    if m.position_embedding == "rope" and not float(m.rope_theta).is_integer():
        issues.append(f"rope_theta {m.rope_theta:g}: Megatron-LM's --rotary-base takes an "
                      "integer")
    # a flag and its value, quoted; a flag taking a list (argparse nargs) gets each item
    lines = [shlex.join(a.split(" ") if a.startswith(_MEGATRON_LIST_FLAGS) else a.split(" ", 1))
             for a in megatron_args(plan)]
    return Export(" \\\n    ".join(lines) + "\n", tuple(issues))


def _deepspeed(plan: Plan) -> Export:
    # The config carries no model: that is the user's code (an MLA model too: AutoTP
    # keeps DeepSeek's q_a_proj / kv_a_proj_with_mqa whole, module_inject/auto_tp.py;
    # a GeGLU one too, whatever its activation).
    issues = unsupported(plan, CAPABILITIES["deepspeed"])
    s, sh, tr = plan_shape(plan), plan.sharding, plan.training
    config: dict = {
        "train_batch_size": tr.global_batch_size,
        "train_micro_batch_size_per_gpu": s.mbs,
        "gradient_accumulation_steps": s.num_microbatches,  # = micro-batches per pipeline
        "gradient_clipping": 1.0,
    }
    if tr.dtype == "bf16":
        config["bf16"] = {"enabled": True}
    elif tr.dtype == "fp16":
        config["fp16"] = {"enabled": True}
    # the reduction's dtype where the plan's is not DeepSpeed's default, the training dtype
    # (runtime/engine.py communication_data_type)
    if tr.comm.grad_reduce_dtype != Communication.preset("deepspeed", dtype=tr.dtype
                                                          ).grad_reduce_dtype:
        config["communication_data_type"] = tr.comm.grad_reduce_dtype
    # Always written, stage 0 included: a config without it would leave the sharding to
    # DeepSpeed's default, which is not what the plan says.
    config["zero_optimization"] = _zero(sh.params, sh.grads, sh.optim, s.dp * s.cp)
    if config["zero_optimization"]["stage"] == 3:
        # ZeRO-3 overlaps its reductions with the backward by default (runtime/zero/
        # config.py overlap_comm_valid); the plan's DeepSpeed reduces after it
        # (`Communication.preset`, FrameworkCapabilities.comm_settable has no overlap)
        config["zero_optimization"]["overlap_comm"] = False
    if s.tp > 1:
        config["tensor_parallel"] = {"autotp_size": s.tp}
    full = s.recompute[0] == Recompute.FULL
    notes = []
    if s.pp > 1:
        # the pipeline engine reads activation_checkpoint_interval (and the partitioning
        # flags) of this section; the stage count and split are the PipelineModule's
        # arguments (runtime/pipe/engine.py, runtime/pipe/module.py), so they are a note
        config["pipeline"] = {"activation_checkpoint_interval": 1 if full else 0}
        notes.append(f"DeepSpeed takes the pipeline's stages and layer split from the "
                     f"PipelineModule your script builds, not from this config: build it "
                     f"with num_stages={s.pp} and partition_method='type:<your transformer "
                     f"layer class>' ({s.layers[0]} transformer layers a stage, as the plan "
                     "splits them; 'parameters', the default, and 'uniform' count the "
                     "embedding and head as layers too)")
    if full:
        config["activation_checkpointing"] = {"partition_activations": False,
                                              "contiguous_memory_optimization": False}
    if full and s.pp == 1:
        # outside the pipeline engine no config key recomputes anything: the section above
        # only configures deepspeed.checkpointing.checkpoint, which the model must call
        # (runtime/activation_checkpointing/config.py, checkpointing.py)
        notes.append("DeepSpeed recomputes only what your model code wraps: call "
                     "deepspeed.checkpointing.checkpoint on each transformer layer's forward "
                     "(the plan recomputes every layer in full; this config's "
                     "activation_checkpointing section only configures that function)")
    return Export(json.dumps(config, indent=2) + "\n", tuple(issues), tuple(notes))


def _zero(params: int, grads: int, optim: int, dp: int) -> dict:
    """DeepSpeed's zero_optimization for P/G/OS group sizes (the nearest stage where none
    matches: the caller has listed the mismatch)."""
    if params == grads == optim and 1 < params < dp:
        return {"stage": 3, "mics_shard_size": params}
    if params > 1:
        return {"stage": 3}
    if grads > 1:
        return {"stage": 2}
    return {"stage": 1 if optim > 1 else 0}


# torch.distributed.pipelining's class names as torchtitan takes them
_TITAN_SCHEDULES = {Schedule.GPIPE: "GPipe", Schedule.ONE_F_ONE_B: "1F1B",
                    Schedule.INTERLEAVED_1F1B: "Interleaved1F1B",
                    Schedule.ZB_H1: "InterleavedZeroBubble"}
# presets that are torchtitan 0.2.2 llama3 flavors (models/llama3/__init__.py)
_TITAN_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"),
                  "llama3-405b": ("llama3", "405B"),
                  # models/deepseek_v3/__init__.py: MLA and DeepSeekMoE at these shapes
                  "deepseek-v2-lite": ("deepseek_v3", "16B"),
                  "deepseek-v2": ("deepseek_v3", "236B"),
                  "deepseek-v3": ("deepseek_v3", "671B")}


# ModelSpec fields that are training settings, not a flavor's shape: torchtitan takes the
# sequence from [training], has no dropout, and routes as its own MoE code does
_NOT_SHAPE = frozenset({"seq_len", "dropout", "attention_dropout", "load_imbalance",
                        "capacity_factor", "pad_to_capacity"})


def _titan_flavor(model: ModelSpec) -> tuple[str, str] | None:
    """torchtitan's (name, flavor) of a preset's shape; None where the model is none, or a
    model file kept a preset's name with another shape."""
    flavor = _TITAN_FLAVORS.get(model.name)
    if flavor is None:
        return None
    known = preset(model.name)
    same = all(getattr(model, f.name) == getattr(known, f.name) for f in fields(ModelSpec)
               if f.name not in _NOT_SHAPE)
    return flavor if same else None


def _titan_rope(model: ModelSpec) -> str:
    """The RoPE base a registered model must have (its model args' rope_theta)."""
    return (f", rope_theta {model.rope_theta:g}" if model.position_embedding == "rope"
            else "")


def _torchtitan(plan: Plan) -> Export:
    issues = unsupported(plan, CAPABILITIES["torchtitan"])
    s, sh, tr = plan_shape(plan), plan.sharding, plan.training
    # FSDP2 over all replicas, or HSDP within groups of P; torchtitan shards over
    # dp_shard x cp (parallel_dims.py), and the plan's sizes count those ranks
    shard = max(1, sh.params // s.cp) if sh.params > 1 else 1
    model = _titan_flavor(plan.model)
    other = (f" (not torchtitan's {' '.join(_TITAN_FLAVORS[plan.model.name])}: the plan's "
             "model has another shape)" if plan.model.name in _TITAN_FLAVORS and not model
             else "")
    lines = ["[model]"]
    mla = " with multi-latent attention (deepseek_v3)" if plan.model.is_mla else ""
    # torchtitan 0.2.2's own models gate their feed-forward with SiLU (models/llama3,
    # llama4, qwen3, deepseek_v3, moe/moe.py; gpt_oss with x * sigmoid(1.702 x)): a GeGLU
    # model is one the user registers (protocols/train_spec.py register_train_spec)
    geglu = (", a GELU-gated feed-forward (GeGLU; torchtitan's own models gate with SiLU)"
             if plan.model.activation == "geglu" else "")
    lines += ([f'name = "{model[0]}"', f'flavor = "{model[1]}"'] if model else
              [f"# {plan.model.name}{other}: set name and flavor to a registered model of "
               "this shape "
               f"({plan.model.num_layers} layers, hidden {plan.model.hidden_size}{mla}{geglu}"
               f"{_titan_rope(plan.model)})"])
    # torchtitan 0.2.2's models apply no dropout (models/llama3/model/model.py and the
    # rest): the plan's dropout is priced, not trained
    dropped = [k for k, on in (("attention", plan.model.drops_attention),
                               ("hidden", plan.model.dropout)) if on]
    if dropped:
        lines.append(f"# the plan's {' and '.join(dropped)} dropout: torchtitan's models "
                     "apply none (the plan priced it)")
    lines += [
        "", "[training]",
        # with pp > 1 a replica's batch is one step split into micro-batches; without,
        # torchtitan accumulates global / (local * dp) micro-batches of local_batch_size
        f"local_batch_size = {s.mbs * s.num_microbatches if s.pp > 1 else s.mbs}",
        f"global_batch_size = {tr.global_batch_size}", f"seq_len = {tr.seq_len}",
        f'mixed_precision_param = "{"float32" if tr.dtype == "fp32" else "bfloat16"}"',
        "", "[parallelism]", f"data_parallel_replicate_degree = {s.dp // shard}",
        f"data_parallel_shard_degree = {shard}", f"tensor_parallel_degree = {s.tp}",
        f"pipeline_parallel_degree = {s.pp}", f"context_parallel_degree = {s.cp}",
    ]
    if s.ep > 1:
        lines.append(f"expert_parallel_degree = {s.ep}")
        # always written: the plan's etp left out means tp (Megatron's default), and
        # torchtitan's own default is 1 (job_config.py `expert_tensor_parallel_degree`)
        etp = plan.training.etp or s.tp
        lines.append(f"expert_tensor_parallel_degree = {etp}")
        if tr.comm.moe_dispatcher == "deepep":  # job_config.py Parallelism
            lines.append('expert_parallel_comm_backend = "deepep"')
        # torchtitan/distributed/parallel_dims.py: efsdp = dp_shard x cp x tp / (etp x ep),
        # so ep groups are carved out of dp_shard x cp (etp = tp) or with the tp ranks
        # too (etp 1)
        room = shard * s.cp * (s.tp // etp)
        if room % s.ep:
            issues.append(f"ep {s.ep}: torchtitan carves ep out of dp_shard x cp"
                          f"{' x tp' if etp == 1 and s.tp > 1 else ''} = {room}; shard the "
                          "parameters over a multiple of ep")
    if shard > 1 or s.cp > 1:
        # FSDP frees each unit's gathered parameters after its forward and gathers them
        # again for the backward, as the plan prices ZeRO-3; torchtitan's "default" keeps
        # them gathered through the step whenever pp > 1 (parallelize.py apply_fsdp:
        # reshard_after_forward = not pp_enabled)
        lines.append('fsdp_reshard_after_forward = "always"')
    if s.pp > 1:
        lines += [f'pipeline_parallel_schedule = "{_TITAN_SCHEDULES[tr.schedule]}"',
                  f"pipeline_parallel_microbatch_size = {s.mbs}"]
        lines += _torchtitan_split(plan, s, issues)
    lines += ["", "[activation_checkpoint]", f'mode = "{s.recompute[0]}"']
    return Export("\n".join(lines) + "\n", tuple(issues))


def _torchtitan_split(plan: Plan, s: PlanShape, issues: list[str]) -> list[str]:
    """The plan's layer split as module names per model chunk (exact, uneven too)."""
    chunks = plan_chunk_counts(plan)
    if plan.training.schedule.splits_backward:
        m = s.num_microbatches
        rounds = max(1, m // s.pp)
        if m % rounds:
            issues.append(f"{m} micro-batches: ScheduleInterleavedZeroBubble needs a multiple "
                          f"of max(1, m // pp) = {rounds}")
        if plan.model.num_layers % s.pp == 0:
            return [f"pipeline_parallel_layers_per_stage = {plan.model.num_layers // s.pp}"]
    parts, start = [], 0
    for k, n in enumerate(chunks):
        names = [f"layers.{i}" for i in range(start, start + n)]
        start += n
        if k == 0:
            names.insert(0, "tok_embeddings")
        if k == len(chunks) - 1:
            names += ["norm", "output"]
        parts.append("[" + ", ".join(f'"{x}"' for x in names) + "]")
    return ["module_fqns_per_model_part = [", *(f"    {p}," for p in parts), "]"]


FORMATS = {"megatron": _megatron, "deepspeed": _deepspeed, "torchtitan": _torchtitan}


def export_plan(plan: Plan, fmt: str) -> Export:
    return FORMATS[fmt](plan)
