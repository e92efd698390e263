"""The layout-independent form of model state in a checkpoint: where this rank's tensors
lie in the whole model's.

A checkpoint holds, for every parameter of the whole model, under its whole-model name
(`blocks.1.attn.qkv.weight`, as executor/model.py names it; a fused QKV / SwiGLU weight
with its rows in the model's order, not regrouped as tensor parallelism holds them):

* `<name>`: the fp32 master weights;
* `state.<name>.exp_avg`, `state.<name>.exp_avg_sq`: AdamW's moments, of the same shape;
* `state.<name>.step`: AdamW's step count;

the keys of torch.distributed.checkpoint.state_dict's flattened model and optimizer state
dicts; in fp16 also `loss_scaler` (executor/runtime.py), optional on resume. A rank contributes the boxes (offsets and sizes in the whole tensor) it holds: an
AMSP optimizer shard is a flat range of a bucket (executor/data_parallel.py), cut into
boxes per parameter and mapped through the parameter's tensor-parallel placement; an FSDP2
shard is one box. DCP records every box in its metadata; loading asks for the boxes of the
new layout and reads the overlaps (resharding), so any layout loads any other's
checkpoint of the same model.

Every element is written by exactly one rank: copies that are equal by construction
(data-parallel replicas, tp ranks holding a replicated tensor, the other replicas of a
mixed-tp position, a tied head's copy of the embedding) either write the same box, which
DCP keeps once, or do not write (`Piece.write`); DCP's check of the global plan (no
overlapping boxes, every element covered) holds us to it at every save.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch.distributed.checkpoint.default_planner import DefaultSavePlanner
from torch.distributed.checkpoint.metadata import (
    ChunkStorageMetadata,
    Metadata,
    MetadataIndex,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import (
    LoadPlan,
    LoadPlanner,
    ReadItem,
    SavePlan,
    TensorWriteData,
    WriteItem,
    WriteItemType,
)
from torch.distributed.checkpoint.planner_helpers import create_read_items_for_chunk_list

__all__ = ["ADAM_MOMENTS", "LoadPieces", "ParamPlace", "Piece", "SavePieces", "check_pieces", "place_of",
           "range_pieces", "state_pieces", "tp_segments"]

ADAM_MOMENTS = ("exp_avg", "exp_avg_sq")


@dataclass(frozen=True)
class ParamPlace:
    """Where a parameter's local tensor lies in the whole model's parameter `name`."""

    name: str  # whole-model name (a tied head's copy: the embedding's, `wte.weight`)
    shape: tuple[int, ...]  # of the whole parameter
    dim: int = 0  # the dim tensor parallelism splits
    # (local start, whole start, length) along `dim`; None: the local tensor is the whole
    segments: tuple[tuple[int, int, int], ...] | None = None
    copy: bool = False  # a tied head's copy of the embedding (the embedding writes it)
    write: bool = True  # this rank writes its local tensor (else an equal one elsewhere does)

    @property
    def local_shape(self) -> tuple[int, ...]:
        if self.segments is None:
            return self.shape
        size = sum(n for _, _, n in self.segments)
        return (*self.shape[:self.dim], size, *self.shape[self.dim + 1:])


def place_of(name: str, param: torch.Tensor, *, widths: list[int] | None = None
             ) -> ParamPlace:
    """A parameter's place from its DTensor placement (a plain tensor, or a replicated
    one, is the whole). `widths`: the row blocks of a fused weight, which tensor
    parallelism regroups so that a rank holds its `torch.chunk` of each block
    (executor/tensor_parallel.py `fused_rows`)."""
    from torch.distributed.tensor import DTensor, Shard

    shape = tuple(param.shape)  # a DTensor's shape is the whole's
    placement = param.placements[0] if isinstance(param, DTensor) else None
    if not isinstance(placement, Shard):
        return ParamPlace(name, shape)
    assert isinstance(param, DTensor) and param.device_mesh.ndim == 1, name
    dim = placement.dim % len(shape)
    blocks = widths if widths and dim == 0 else [shape[dim]]
    segments = tp_segments(blocks, tp=param.device_mesh.size(),
                           rank=param.device_mesh.get_local_rank())
    assert sum(n for _, _, n in segments) == param._local_tensor.shape[dim], (name, segments)
    return ParamPlace(name, shape, dim, segments)


def tp_segments(blocks: list[int], *, tp: int, rank: int) -> tuple[tuple[int, int, int], ...]:
    """(local start, whole start, length) of tp rank `rank`'s part of a dim made of row
    blocks of `blocks` widths: its `torch.chunk` of each block (as DTensor cuts, and as
    executor/tensor_parallel.py `regroup_rows` orders a fused weight's rows)."""
    segments, local, whole = [], 0, 0
    for w in blocks:
        size = -(-w // tp)
        first = min(rank * size, w)
        n = min(size, w - first)
        if n > 0:
            segments.append((local, whole + first, n))
        local += n
        whole += w
    return tuple(segments)


@dataclass(frozen=True)
class Piece:
    """One box of a whole-model tensor that this rank holds: `tensor` (a view of the
    rank's state, of the box's sizes) is the part at `offsets` of the tensor `key` of
    `shape`. An `optional` one (fp16's loss scaler) keeps its value when a checkpoint
    (of another dtype) lacks it."""

    key: str
    shape: tuple[int, ...]
    offsets: tuple[int, ...]
    tensor: torch.Tensor = field(repr=False)
    write: bool = True
    optional: bool = False


def _boxes(shape: tuple[int, ...], lo: int, hi: int) -> list[tuple[tuple[int, ...],
                                                                    tuple[int, ...]]]:
    """(offsets, sizes) of boxes of a C-ordered tensor of `shape` that hold its flat
    elements [lo, hi), in order, each a contiguous run of them."""
    if hi <= lo:
        return []
    if not shape:
        return [((), ())]
    inner = math.prod(shape[1:])
    out = []
    if lo % inner:  # the rest of a row
        row = lo // inner
        end = min(hi, (row + 1) * inner)
        out += [((row, *o), (1, *s)) for o, s in _boxes(shape[1:], lo - row * inner,
                                                        end - row * inner)]
        lo = end
    whole_rows_end = hi // inner * inner
    if lo < whole_rows_end:  # whole rows
        out.append(((lo // inner, *[0] * (len(shape) - 1)),
                    ((whole_rows_end - lo) // inner, *shape[1:])))
        lo = whole_rows_end
    if lo < hi:  # the start of a row
        row = lo // inner
        out += [((row, *o), (1, *s)) for o, s in _boxes(shape[1:], 0, hi - row * inner)]
    return out


def _to_whole(key: str, place: ParamPlace, offsets: tuple[int, ...], box: torch.Tensor, *,
              write: bool) -> list[Piece]:
    """A box of the local tensor, as pieces of the whole (cut at the segments)."""
    if place.segments is None:
        return [Piece(key, place.shape, offsets, box, write)]
    d, out = place.dim, []
    first, last = offsets[d], offsets[d] + box.shape[d]
    for local, whole, n in place.segments:
        a, b = max(first, local), min(last, local + n)
        if a < b:
            at = (*offsets[:d], whole + a - local, *offsets[d + 1:])
            out.append(Piece(key, place.shape, at, box.narrow(d, a - first, b - a), write))
    return out


def range_pieces(key: str, place: ParamPlace, flat: torch.Tensor, lo: int, hi: int, *,
                 write: bool) -> list[Piece]:
    """The elements [lo, hi) of a parameter's local tensor (in its flat order), held in
    the 1-D `flat` (flat[0] is element lo), as pieces of the whole tensor `key`."""
    shape = place.local_shape
    strides = [math.prod(shape[i + 1:]) for i in range(len(shape))]
    out = []
    for offsets, sizes in _boxes(shape, lo, hi):
        start = sum(o * s for o, s in zip(offsets, strides, strict=True)) - lo
        box = flat[start:start + math.prod(sizes)].view(sizes)
        out += _to_whole(key, place, offsets, box, write=write)
    return out


def state_pieces(place: ParamPlace, lo: int, hi: int, *, master: torch.Tensor | None,
                 adam: dict[str, torch.Tensor], write: bool) -> list[Piece]:
    """Master weights (if held here) and AdamW state of the elements [lo, hi) of a
    parameter's local tensor; `master` and the moments are 1-D, starting at element lo."""
    out = [] if master is None else range_pieces(place.name, place, master, lo, hi,
                                                 write=write)
    for kind in ADAM_MOMENTS:
        out += range_pieces(f"state.{place.name}.{kind}", place, adam[kind], lo, hi,
                            write=write)
    out.append(Piece(f"state.{place.name}.step", (), (), adam["step"], write))
    return out


def check_pieces(pieces: list[Piece], metadata: Metadata) -> str | None:
    """What keeps `pieces` from loading from a checkpoint of this `metadata`: a missing
    tensor, another shape, or elements the checkpoint does not hold; None if nothing."""
    for p in pieces:
        md = metadata.state_dict_metadata.get(p.key)
        if md is None and p.optional:
            continue
        if not isinstance(md, TensorStorageMetadata):
            return f"it holds no tensor {p.key}"
        if tuple(md.size) != p.shape:
            return f"its {p.key} is {tuple(md.size)}, this model's is {p.shape}"
        chunk = ChunkStorageMetadata(torch.Size(p.offsets), p.tensor.shape)
        found = sum(math.prod(r.lengths)
                    for r in create_read_items_for_chunk_list(p.key, md, [chunk]))
        if found != p.tensor.numel():
            return f"it holds {found} of the {p.tensor.numel()} elements of {p.key} " \
                   f"at {p.offsets}"
    return None


def _by_box(pieces: list[Piece]) -> dict[tuple[str, tuple[int, ...]], list[Piece]]:
    out: dict[tuple[str, tuple[int, ...]], list[Piece]] = {}
    for p in pieces:
        if p.tensor.numel() or not p.shape:
            out.setdefault((p.key, p.offsets), []).append(p)
    return out


class SavePieces(DefaultSavePlanner):
    """DCP's default save planning (equal boxes of several ranks written once, the
    global plan checked) over this rank's pieces instead of a state dict."""

    def __init__(self, pieces: list[Piece]) -> None:
        super().__init__(flatten_state_dict=False, flatten_sharded_tensors=False)
        boxes = _by_box([p for p in pieces if p.write])
        for same in boxes.values():  # the same box twice here: one tensor (a shared step)
            assert all(p.tensor.shape == same[0].tensor.shape for p in same), same
        self._boxes = {k: v[0] for k, v in boxes.items()}

    def set_up_planner(self, state_dict: dict, storage_meta: object = None,
                       is_coordinator: bool = False) -> None:
        self.state_dict, self.is_coordinator = {}, is_coordinator

    def create_local_plan(self) -> SavePlan:
        items = []
        for (key, offsets), p in self._boxes.items():
            items.append(WriteItem(
                index=MetadataIndex(key, offsets), type=WriteItemType.SHARD,
                tensor_data=TensorWriteData(
                    chunk=ChunkStorageMetadata(torch.Size(offsets), p.tensor.shape),
                    properties=TensorProperties.create_from_tensor(p.tensor),
                    size=torch.Size(p.shape))))
        self.plan = SavePlan(items)
        return self.plan

    def resolve_data(self, write_item: WriteItem) -> torch.Tensor:
        index = write_item.index
        return self._boxes[(index.fqn, tuple(index.offset or ()))].tensor.detach()


def _narrow(t: torch.Tensor, offsets: torch.Size, lengths: torch.Size) -> torch.Tensor:
    for d, (o, n) in enumerate(zip(offsets, lengths, strict=True)):
        t = t.narrow(d, o, n)
    return t


class LoadPieces(LoadPlanner):
    """Read this rank's pieces from a checkpoint of any layout: DCP's resharding reads
    (`create_read_items_for_chunk_list`) of each box, straight into its tensor."""

    def __init__(self, pieces: list[Piece]) -> None:
        self._pieces = pieces

    def set_up_planner(self, state_dict: dict, metadata: Metadata | None = None,
                       is_coordinator: bool = False) -> None:
        assert metadata is not None
        self.metadata = metadata
        self._boxes = _by_box([p for p in self._pieces
                               if not p.optional or p.key in metadata.state_dict_metadata])

    def create_local_plan(self) -> LoadPlan:
        items: list[ReadItem] = []
        for (key, offsets), same in self._boxes.items():
            md = self.metadata.state_dict_metadata[key]
            assert isinstance(md, TensorStorageMetadata), key  # check_pieces said so
            chunk = ChunkStorageMetadata(torch.Size(offsets), same[0].tensor.shape)
            items += create_read_items_for_chunk_list(key, md, [chunk])
        return LoadPlan(items)

    def create_global_plan(self, global_plan: list[LoadPlan]) -> list[LoadPlan]:
        return global_plan

    def finish_plan(self, central_plan: LoadPlan) -> LoadPlan:
        return central_plan

    def load_bytes(self, read_item: ReadItem, value: object) -> None:
        raise AssertionError(f"no byte items in a checkpoint: {read_item.dest_index.fqn}")

    def _targets(self, read_item: ReadItem) -> list[torch.Tensor]:
        index = read_item.dest_index
        return [_narrow(p.tensor, read_item.dest_offsets, read_item.lengths)
                for p in self._boxes[(index.fqn, tuple(index.offset or ()))]]

    def resolve_tensor(self, read_item: ReadItem) -> torch.Tensor:
        return self._targets(read_item)[0]

    def commit_tensor(self, read_item: ReadItem, tensor: torch.Tensor) -> None:
        for other in self._targets(read_item)[1:]:  # the same box twice here
            other.detach().copy_(tensor)
