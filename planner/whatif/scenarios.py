"""What-if scenarios: small edits to the baseline cluster, model, prices or token budget.

A scenario is `[LABEL:] CHANGE [; CHANGE ...]`, each change one of:

    add TYPE COUNT [ISLAND]        add COUNT GPUs of a catalog TYPE in its standard nodes
                                   (to the island of that type, or the one named; at the
                                   cluster's price for TYPE)
    add TYPE COUNT island NAME link GBPS [latency MS] [price USD]
                                   ... on a new island NAME (its own datacenter, e.g.
                                   rented cloud GPUs) joined to every other island by a
                                   link of GBPS Gbit/s (Ethernet; latency in ms), and a
                                   price per GPU-hour for these GPUs
    remove TYPE COUNT              remove COUNT GPUs of TYPE (whole nodes, last ones first)
    swap OLD NEW                   replace every OLD GPU by a NEW one (same count, NEW's
                                   standard node and NICs, the cluster's price for NEW)
    scale-nic TYPE|GROUP FACTOR    multiply the NIC bandwidth of those nodes
    scale-link A B FACTOR          multiply the bandwidth of the link between islands A, B
    price TYPE USD                 price per GPU-hour of TYPE
    egress-price USD               price per GB crossing every island link
    model NAME                     another model preset
    tokens N                       another token budget

The changes apply in order and the cluster is checked once all have applied, so
'remove A100-80GB-SXM 128; add H100-80GB-SXM 64' works as well as the other order. A
scenario's cluster is named after it. Errors name the scenario and the word that is
wrong, in one line.
"""

from __future__ import annotations

import math
import re
import shlex
from collections.abc import Callable
from dataclasses import dataclass, replace

from planner.specs.cluster import NIC_GBIT_RANGE, ClusterSpec, IslandLink, NodeGroup, by_name
from planner.specs.limits import MAX_GPUS, MAX_TOKENS
from planner.specs.model import ModelSpec, preset
from profiler.devices import DeviceSpec, device
from profiler.schema import SpecError, dump, fail, parse

__all__ = ["Scenario", "Setting", "apply", "parse_scenario"]


@dataclass(frozen=True)
class Setting:
    """What one scenario plans for."""

    label: str
    model: ModelSpec
    cluster: ClusterSpec
    tokens: float


@dataclass(frozen=True)
class Scenario:
    label: str
    changes: tuple[tuple[str, ...], ...]  # each: (verb, args...)


_ARITY = {"add": (2, 10), "remove": (2, 2), "swap": (2, 2), "scale-nic": (2, 2),
          "scale-link": (3, 3), "price": (2, 2), "egress-price": (1, 1), "model": (1, 1),
          "tokens": (1, 1)}


def parse_scenario(text: str, *, where: str = "--scenario") -> Scenario:
    label, sep, body = text.partition(":")  # no change contains a colon
    if not sep:
        label, body = "", text  # no label: the changes name the scenario
    changes = []
    for part in body.split(";"):
        try:
            words = shlex.split(part)
        except ValueError as err:  # an unbalanced quote
            fail(where, text, f"{err}".lower())
        if not words:
            continue
        verb, args = words[0], words[1:]
        if verb not in _ARITY:
            if label.split()[:1] and label.split()[0] in _ARITY:  # e.g. "add 8:H100"
                fail(where, text, f"{label.strip()!r} before ':' is read as the scenario's "
                     f"label; a change is written without ':', e.g. 'add TYPE COUNT'")
            fail(where, text, f"{verb!r} is not a change; use one of {', '.join(_ARITY)}")
        lo, hi = _ARITY[verb]
        if not lo <= len(args) <= hi:
            fail(where, text, f"{verb} takes {lo if lo == hi else f'{lo}-{hi}'} arguments")
        changes.append((verb, *args))
    if not changes:
        fail(where, text, "no change given (e.g. 'add H100-80GB-SXM 64')")
    label = label.strip()
    if label and (set(label) & _MARKUP or not any(c.isalnum() for c in label)
                  or not label.isprintable()):
        # the label heads a report row, a Markdown table cell and a file name
        fail(where, text, f"its label {label!r} needs a letter or digit and none of "
             f"{' '.join(sorted(_MARKUP))} or control characters (tabs, line breaks)")
    # unlabelled, the changes name it, with any run of blanks (a tab) as one space
    return Scenario(label or " ".join(body.split()), tuple(changes))


_MARKUP = set("|<>*`[]\\")


def apply(scenario: Scenario, base: Setting, *, where: str = "--scenario") -> Setting:
    """The setting after the scenario's changes, in order; its cluster (named after the
    scenario) is checked once they all have applied. Node groups emptied on the way are
    kept until then (a later 'add' finds their island), then dropped with the links of
    islands left without GPUs."""
    s = replace(base, label=scenario.label,
                cluster=replace(base.cluster, name=f"{scenario.label} ({base.cluster.name})"))
    try:
        for change in scenario.changes:
            s = _APPLY[change[0]](s, *change[1:])
        return replace(s, cluster=_final(s.cluster))
    except SpecError as err:
        raise SpecError(f"{where}: {scenario.label!r}: {err}") from None


def _final(cluster: ClusterSpec) -> ClusterSpec:
    groups = tuple(g for g in cluster.node_groups if g.num_nodes > 0)
    if not groups:
        fail("scenario", cluster.name, "it leaves no GPUs")
    islands = {g.island for g in groups}
    links = tuple(k for k in cluster.island_links if set(k.islands) <= islands)
    # validated as a cluster file is (every field in its range, the cluster's own rules),
    # so a scenario is exactly a cluster file
    return parse(ClusterSpec, dump(replace(cluster, node_groups=groups, island_links=links)),
                 where="cluster")


def _count(text: str, what: str) -> int:
    if not re.fullmatch(r"[0-9]+", text):  # ASCII digits only
        fail(what, text, "a positive whole number")
    # the digits counted before int(): a string of thousands of them is refused as such
    n = int(text) if len(text.lstrip("0")) <= len(str(MAX_GPUS)) else MAX_GPUS + 1
    if n > MAX_GPUS:
        fail(what, text, f"at most {MAX_GPUS:,}, the most GPUs a cluster holds")
    if n < 1:
        fail(what, text, "a positive whole number")
    return n


def _number(text: str, what: str, rule: str) -> float:
    """A finite ASCII number, or a SpecError naming `what`."""
    try:
        value = float(text) if text.isascii() else math.nan
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        fail(what, text, rule)
    return value


def _factor(text: str, what: str = "factor") -> float:
    value = _number(text, what, "a positive number")
    if value <= 0:
        fail(what, text, "a positive number")
    return value


def _device(s: Setting, gpu: str, where: str = "gpu") -> DeviceSpec:
    """A GPU type the cluster defines, else the catalog's; one with a standard node."""
    dev = by_name(s.cluster.devices).get(gpu.lower()) or device(gpu)
    if dev.node is None:
        fail(where, gpu, f"{dev.name} defines no standard node to add or swap in")
    return dev


def _device_name(s: Setting, gpu: str) -> str:
    mine = by_name(s.cluster.devices).get(gpu.lower())
    return mine.name if mine is not None else device(gpu).name


_ADD_WORDS = ("island", "link", "latency", "price")


def _add(s: Setting, gpu: str, count: str, *rest: str) -> Setting:
    dev = _device(s, gpu)
    n = _count(count, "count")
    assert dev.node is not None
    per_node = dev.node.gpus_per_node
    if n % per_node:
        fail("count", n, f"whole {dev.node.name} nodes: a multiple of {per_node}")
    opts = _add_options(rest)
    groups = s.cluster.node_groups
    same = [g for g in groups if g.gpu == dev.name]
    known = {g.island for g in groups}
    island = opts.get("island") or (same[0].island if same else
                                    groups[0].island if groups else "island0")
    links = s.cluster.island_links
    if island in known or not known:
        if "link" in opts:
            fail("link", opts["link"], f"only for a new island ({island!r} is the cluster's)")
        datacenter = next((g.datacenter for g in groups if g.island == island), "dc0")
    else:  # a new island in a datacenter of its own, linked to every other island
        if "link" not in opts:
            fail("island", island, "one of the cluster's (" + ", ".join(sorted(known))
                 + "), or a new one with 'link GBPS' (its bandwidth to the others)")
        link = IslandLink(islands=("", island), bandwidth_gbit_per_s=_factor(opts["link"],
                                                                            "link"))
        if "latency" in opts:
            link = replace(link, latency_ms=_factor(opts["latency"], "latency"))
        datacenter = island
        links = (*links, *(replace(link, islands=(other, island)) for other in sorted(known)))
    price = (_usd_per_gpu_hour(opts["price"]) if "price" in opts
             else same[0].price_per_gpu_hour_usd if same else None)
    own = any(d.name == dev.name for d in s.cluster.devices)  # a type the cluster defines
    group = NodeGroup(name=f"added-{dev.name.lower()}-{len(groups)}",
                      gpu=dev.name, num_nodes=n // per_node, island=island,
                      datacenter=datacenter, price_per_gpu_hour_usd=price,
                      gpu_spec=dev if own else None).resolved()
    return replace(s, cluster=replace(s.cluster, node_groups=(*groups, group),
                                      island_links=links))


def _add_options(rest: tuple[str, ...]) -> dict[str, str]:
    """'add TYPE COUNT ISLAND' (an island of the cluster), or keyword pairs: island NAME,
    link GBPS, latency MS, price USD."""
    if len(rest) == 1:
        return {"island": rest[0]}
    if len(rest) % 2 or any(w not in _ADD_WORDS for w in rest[::2]):
        fail("add", " ".join(rest), "TYPE COUNT [ISLAND], or then pairs of "
             + ", ".join(f"'{w} VALUE'" for w in _ADD_WORDS))
    return dict(zip(rest[::2], rest[1::2], strict=True))


def _remove(s: Setting, gpu: str, count: str) -> Setting:
    name = _device_name(s, gpu)
    left = _count(count, "count")
    kept: list[NodeGroup] = []
    for g in reversed(s.cluster.node_groups):  # the last nodes of that type first
        if g.gpu != name or left == 0:
            kept.append(g)
            continue
        per = g.gpus_per_node or 1
        nodes = min(g.num_nodes, math.ceil(left / per))
        if left % per and nodes * per > left:
            fail("count", count, f"whole nodes of {per} GPUs")
        left -= nodes * per
        kept.append(replace(g, num_nodes=g.num_nodes - nodes))  # empty ones go at the end
    if left > 0:
        fail("count", count, f"the cluster has fewer {name} GPUs")
    kept.reverse()
    return _with_groups(s, tuple(kept))


def _swap(s: Setting, old: str, new: str) -> Setting:
    o, n = _device_name(s, old), _device(s, new, "swap")
    assert n.node is not None
    if o == n.name:  # it changed nothing and ran as the baseline, under another label
        fail("swap", f"{old} {new}", "two different GPU types")
    if not any(g.gpu == o for g in s.cluster.node_groups):
        fail("swap", old, "a GPU type of the cluster")
    groups = []
    for g in s.cluster.node_groups:
        if g.gpu != o:
            groups.append(g)
            continue
        per = n.node.gpus_per_node
        gpus = g.num_gpus
        if gpus % per:
            fail("swap", new, f"{gpus} GPUs do not fill {n.node.name} nodes of {per}")
        # NEW's standard node and NICs, at the price the cluster already pays for NEW
        # (unknown unless the cluster has some or the scenario sets one)
        price = next((h.price_per_gpu_hour_usd for h in s.cluster.node_groups
                      if h.gpu == n.name), None)
        own = any(d.name == n.name for d in s.cluster.devices)  # a type the cluster defines
        # a group named after its GPU type (as --gpus names it) is named after the new one
        name = n.name.lower() if g.name == o.lower() else g.name
        if name != g.name and any(h.name == name for h in s.cluster.node_groups):
            name = g.name
        groups.append(NodeGroup(name=name, gpu=n.name, num_nodes=gpus // per,
                                island=g.island, datacenter=g.datacenter,
                                price_per_gpu_hour_usd=price,
                                gpu_spec=n if own else None).resolved())
    return _with_groups(s, tuple(groups))


def _scale_nic(s: Setting, what: str, factor: str) -> Setting:
    f = _factor(factor)
    hit = [g for g in s.cluster.node_groups
           if what.lower() in (g.name.lower(), g.gpu.lower())]  # as `price` and `swap` take it
    if not hit:
        fail("scale-nic", what, "a node group name or GPU type of the cluster")
    # the NIC's bounds (NodeGroup.nic_bandwidth_gbit_per_s) as a bound on the factor: the
    # message named the cluster's field path and the product, not the factor
    low, high = NIC_GBIT_RANGE
    fastest = max(g.nic_bandwidth_gbit_per_s or 0.0 for g in hit)
    slowest = min(g.nic_bandwidth_gbit_per_s or high for g in hit)
    if f * fastest > high or f * slowest < low:
        rates = f"{slowest:g}" if slowest == fastest else f"{slowest:g} to {fastest:g}"
        fail("scale-nic factor", factor, f"{low / slowest:g} to {high / fastest:g} here: a NIC "
             f"runs {low:g} to {high:,g} Gb/s, {what}'s {rates} Gb/s")
    groups = tuple(replace(g, nic_bandwidth_gbit_per_s=g.nic_bandwidth_gbit_per_s * f)  # type: ignore[operator]  # resolved clusters have NIC bandwidths
                   if g in hit else g for g in s.cluster.node_groups)
    return _with_groups(s, groups)


def _scale_link(s: Setting, a: str, b: str, factor: str) -> Setting:
    f = _factor(factor)
    link = s.cluster.island_link(a, b)
    if link is None:
        fail("scale-link", f"{a} {b}", "two islands the cluster links")
    links = tuple(replace(k, bandwidth_gbit_per_s=k.bandwidth_gbit_per_s * f) if k is link else k
                  for k in s.cluster.island_links)
    return replace(s, cluster=replace(s.cluster, island_links=links))  # checked by `apply`


def _usd_per_gpu_hour(text: str) -> float:
    """A GPU-hour price, 0 (owned GPUs) or more, as a cluster file takes it; its upper
    bound is the cluster spec's (`NodeGroup.price_per_gpu_hour_usd`, checked by `apply`)."""
    rule = "a number of $ per GPU-hour, 0 or more"
    value = _number(text, "price", rule)
    if value < 0:
        fail("price", text, rule)
    return value


def _price(s: Setting, gpu: str, usd: str) -> Setting:
    name = _device_name(s, gpu)
    value = _usd_per_gpu_hour(usd)
    if not any(g.gpu == name for g in s.cluster.node_groups):
        fail("price", gpu, "a GPU type of the cluster")
    groups = tuple(replace(g, price_per_gpu_hour_usd=value) if g.gpu == name else g
                   for g in s.cluster.node_groups)
    return _with_groups(s, groups)


def _egress(s: Setting, usd: str) -> Setting:
    value = _number(usd, "egress-price", "a number of $ per GB, 0 or more")  # 0: free
    if value < 0:
        fail("egress-price", usd, "a number of $ per GB, 0 or more")
    if not s.cluster.island_links:
        fail("egress-price", usd, "the cluster has no links between islands")
    links = tuple(replace(k, price_per_gb_usd=value) for k in s.cluster.island_links)
    return replace(s, cluster=replace(s.cluster, island_links=links))  # checked by `apply`


def _model(s: Setting, name: str) -> Setting:
    return replace(s, model=preset(name))


def _tokens(s: Setting, text: str) -> Setting:
    value = _number(text, "tokens", "a number of tokens, e.g. 3e11")
    if value <= 0:
        fail("tokens", text, "must be > 0")
    if value > MAX_TOKENS:
        fail("tokens", text, f"must be ≤ {MAX_TOKENS:g}")
    return replace(s, tokens=value)


def _with_groups(s: Setting, groups: tuple[NodeGroup, ...]) -> Setting:
    return replace(s, cluster=replace(s.cluster, node_groups=groups))  # checked by `apply`


_APPLY: dict[str, Callable[..., Setting]] = {"add": _add, "remove": _remove, "swap": _swap, "scale-nic": _scale_nic,
          "scale-link": _scale_link, "price": _price, "egress-price": _egress,
          "model": _model, "tokens": _tokens}
