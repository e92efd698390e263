"""`plan gpus`: one line per device type of the catalog."""

from __future__ import annotations

import argparse

from planner.commands.args import add_catalog_arg, print_json
from planner.commands.inputs import extra_catalog
from profiler.devices import DeviceSpec, catalog, link_kind
from profiler.schema import dump

__all__ = ["add_parser", "run"]


def add_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("gpus", help="list the device catalog")
    p.add_argument("--json", action="store_true",
                   help="print the catalog as JSON (each figure's source too)")
    add_catalog_arg(p)


def run(args: argparse.Namespace) -> int:
    devices = {**catalog(), **(extra_catalog(args) or {})}
    if args.json:  # the catalog file format (--catalog reads it back)
        print_json({name: {k: v for k, v in dump(d).items() if k != "name"}
                    for name, d in devices.items()})
        return 0
    print(f"{'name':16} {'memory':>9} {'fp8':>9} {'bf16':>9} {'fp16':>9} {'tf32':>8} "
          f"{'fp32':>7} {'HBM':>9}  standard node (TF: dense TFLOP/s; -: none)")
    for name, d in devices.items():
        fp8, bf16, fp16, tf32 = (_tflops(d.peak_tflops.get(k))
                                 for k in ("fp8", "bf16", "fp16", "tf32"))
        n = d.node
        node = ("none (a cluster file gives its nodes)" if n is None else
                f"{n.name}: {n.gpus_per_node} {'ranks' if d.vendor == 'cpu' else 'GPUs'} "
                f"on {d.intra_node_link} ({_link_rate(d, n.gpus_per_node)}), {n.nics_per_node}x "
                f"{n.nic_bandwidth_gbit_per_s:g} Gb/s {n.nic}"
                + (f"; NVLink domain of {n.nvlink_domain_gpus} GPUs"
                   if n.nvlink_domain_gpus not in (None, n.gpus_per_node) else ""))
        print(f"{name:16} {d.memory_gib:6.1f}GiB {fp8:>9} {bf16:>9} {fp16:>9} {tf32:>8} "
              f"{_tflops(d.peak_tflops.get('fp32')):>7} "
              f"{d.memory_bandwidth_gb_per_s:6.0f}GB/s  {node}")
    return 0


def _link_rate(d: DeviceSpec, gpus_per_node: int) -> str:
    """A GPU's intra-node bandwidth, per direction; on a full mesh what that is to each
    peer (a pair has only its own links: `LinkKind.peer_share`)."""
    rate = f"{d.intra_node_bandwidth_gb_per_s:g} GB/s"
    share = link_kind(d.intra_node_link).peer_share(2, gpus_per_node)
    if share == 1.0:
        return rate
    return (f"{rate}, {d.intra_node_bandwidth_gb_per_s * share:g} to each of "
            f"{gpus_per_node - 1} peers")


def _tflops(value: float | None) -> str:
    """A peak as the table shows it: '-' where the GPU has none, three significant digits
    below 10 (a CPU's 0.05 read as 0.1)."""
    if value is None:
        return "-"
    return f"{value:.1f}TF" if value >= 10 else f"{value:.3g}TF"
