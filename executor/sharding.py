"""AMSP model-state sharding over a data-parallel group, as index arithmetic on one flat
buffer (pure Python: the collectives themselves are in executor/data_parallel.py).

Parameters, gradients and optimizer states are each sharded over p, g and os replicas
(p | g | os | dp; Chen et al. 2023, AMSP; ZeRO-1/2/3 are os = dp, g = os = dp, all = dp).
A member's position i in its block of os replicas fixes its pieces of the flat buffer of
N elements, cut into os chunks:

* gradients are reduce-scattered inside a contiguous block of g replicas (after every
  micro-batch when g > 1): member i keeps G-chunk i mod g (os/g consecutive chunks);
* at the end of the iteration the members of the block that hold the same G-chunk
  (stride g) reduce-scatter it: member i keeps chunk sigma(i) = (i mod g)*(os/g) + i//g,
  its optimizer shard; blocks of os replicas then all-reduce it (stride os);
* parameters: a member keeps P-chunk (i mod g) // (g/p), the p-th part containing its
  optimizer shard. Its param group (p members, stride g/p inside the g block, so that they
  hold different P-chunks in rank order) all-gathers the full parameters before each
  forward and backward; after the step, the members whose optimizer shards make up one
  P-chunk all-gather them into it.

With g contiguous the frequent per-micro-batch reduce-scatter stays inside a node, as the
planner assumes (planner/costs/stages.py dp_sync); the param group is contiguous exactly
when p = g (ZeRO-3, MiCS).
"""

from __future__ import annotations

from dataclasses import dataclass

__all__ = ["ShardLayout"]


@dataclass(frozen=True)
class ShardLayout:
    """One member's view of AMSP sharding over the data-parallel group `members`."""

    members: tuple[int, ...]  # ranks of the data-parallel group, sorted
    rank: int
    params: int = 1
    grads: int = 1
    optim: int = 1

    def __post_init__(self) -> None:
        dp, p, g, os_ = len(self.members), self.params, self.grads, self.optim
        assert g % p == 0 and os_ % g == 0 and dp % os_ == 0, (p, g, os_, dp)
        assert list(self.members) == sorted(self.members) and self.rank in self.members

    @property
    def dp(self) -> int:
        return len(self.members)

    @property
    def position(self) -> int:
        return self.members.index(self.rank)

    @property
    def _i(self) -> int:
        """Position inside the block of os replicas."""
        return self.position % self.optim

    @property
    def _block_start(self) -> int:
        return self.position - self._i

    def _ranks(self, positions: list[int]) -> tuple[int, ...]:
        return tuple(self.members[q] for q in positions)

    # ---- gradients -----------------------------------------------------------------
    @property
    def grad_group(self) -> tuple[int, ...]:
        """The contiguous g replicas that reduce-scatter gradients every micro-batch."""
        start = self.position - self.position % self.grads
        return self._ranks(list(range(start, start + self.grads)))

    @property
    def g_chunk(self) -> int:
        return self._i % self.grads

    @property
    def grad_reduce_group(self) -> tuple[int, ...]:
        """Members of the os block holding the same G-chunk (stride g)."""
        return self._ranks(list(range(self._block_start + self.g_chunk,
                                      self._block_start + self.optim, self.grads)))

    @property
    def replica_group(self) -> tuple[int, ...]:
        """The same optimizer shard in every block of os replicas (stride os)."""
        return self._ranks(list(range(self._i, self.dp, self.optim)))

    @property
    def os_chunk(self) -> int:
        """Index of this member's optimizer shard among the os chunks of the buffer."""
        return self.g_chunk * (self.optim // self.grads) + self._i // self.grads

    # ---- parameters ----------------------------------------------------------------
    @property
    def _a(self) -> int:
        return self.grads // self.params

    @property
    def p_chunk(self) -> int:
        """The part (of p) of the parameters this member keeps."""
        return self.g_chunk // self._a

    @property
    def param_group(self) -> tuple[int, ...]:
        """The p members that gather the full parameters (stride g/p in the g block)."""
        g_start = self.position - self.position % self.grads
        return self._ranks(list(range(g_start + self.g_chunk % self._a, g_start + self.grads,
                                      self._a)))

    @property
    def param_gather_group(self) -> tuple[int, ...]:
        """The os/p members whose optimizer shards make up this member's P-chunk."""
        lo, hi = self.p_chunk * self._a, (self.p_chunk + 1) * self._a
        return self._ranks([self._block_start + i for i in range(self.optim)
                            if lo <= i % self.grads < hi])

    def gather_slots(self) -> tuple[int, ...]:
        """For each member of `param_gather_group` in rank order, the position (in chunks)
        of its optimizer shard inside the P-chunk."""
        first = self.p_chunk * (self.optim // self.params)
        return tuple(ShardLayout(self.members, r, self.params, self.grads, self.optim).os_chunk
                     - first for r in self.param_gather_group)

    def groups(self) -> set[tuple[int, ...]]:
        """Every group of more than one rank this member communicates in."""
        return {grp for grp in (self.grad_group, self.grad_reduce_group, self.replica_group,
                                self.param_group, self.param_gather_group) if len(grp) > 1}
