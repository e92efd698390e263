"""`plan models` and `plan gpus`: one line per preset or device type."""

from __future__ import annotations

from planner.specs.model import model_presets
from profiler.devices import catalog

__all__ = ["list_gpus", "list_models"]


def list_models(*, as_json: bool) -> int:
    presets = model_presets()
    if as_json:
        from planner.cli import print_json
        from profiler.schema import dump

        print_json({name: {**dump(m), "num_params": m.num_params()} for name, m in presets.items()})
        return 0
    print(f"{'name':18} {'params':>8} {'layers':>6} {'hidden':>6} {'heads':>7} {'ffn':>6} "
          f"{'vocab':>7} {'seq':>5}  arch")
    for name, m in presets.items():
        heads = f"{m.num_heads}/{m.kv_heads}" if m.kv_heads != m.num_heads else str(m.num_heads)
        print(f"{name:18} {m.num_params() / 1e9:7.2f}B {m.num_layers:6d} {m.hidden_size:6d} "
              f"{heads:>7} {m.ffn_hidden_size:6d} {m.vocab_size:7d} {m.seq_len:5d}  "
              f"{m.activation}, {m.norm}, {m.position_embedding}"
              f"{', tied' if m.tied_embeddings else ''}")
    return 0


def list_gpus(*, as_json: bool) -> int:
    devices = catalog()
    if as_json:
        from planner.cli import print_json
        from profiler.schema import dump

        print_json({name: dump(d) for name, d in devices.items()})
        return 0
    print(f"{'name':16} {'memory':>9} {'bf16/fp16':>10} {'fp32':>7} {'HBM':>9}  standard node")
    for name, d in devices.items():
        half = d.peak_tflops.get("bf16", d.peak_tflops.get("fp16", 0.0))
        n = d.node
        print(f"{name:16} {d.memory_gib:6.1f}GiB {half:7.1f}TF/s {d.peak_tflops['fp32']:5.1f}TF "
              f"{d.memory_bandwidth_gb_per_s:6.0f}GB/s  {n.name}: {n.gpus_per_node} GPUs on "
              f"{d.intra_node_link} ({d.intra_node_bandwidth_gb_per_s:g} GB/s), "
              f"{n.nics_per_node}x {n.nic_bandwidth_gbit_per_s:g} Gb/s {n.nic}")
    return 0
