"""What the property-based CLI tests found in planner/search: regression tests of crashes
and wrong numbers that are fixed (each was a strict expected failure until then)."""


from planner.search import SearchRequest, search
from planner.specs.cluster import parse_gpus_arg
from planner.specs.model import ModelSpec


def test_search_skips_tp_that_does_not_divide_the_mlp():
    model = ModelSpec(name="m", num_layers=2, hidden_size=64, ffn_hidden_size=129,
                      num_heads=4, vocab_size=64, seq_len=64)
    found = search(SearchRequest(model=model, cluster=parse_gpus_arg("A100-80GB-SXM:4"),
                                 gbs=8, seq_len=64, top=1))
    assert all(s.tp == 1 for p in found.ranked[0].plan.pipelines for s in p.stages)


def _outcome(model: ModelSpec, cluster, gbs: int) -> None:
    """A search that ends in plans or in InfeasiblePlan / SpecError (one line at the CLI)."""
    from planner.errors import InfeasiblePlan, SpecError

    try:
        search(SearchRequest(model=model, cluster=cluster, gbs=gbs, seq_len=model.seq_len,
                             top=1))
    except (InfeasiblePlan, SpecError):
        pass


def _two_a100_types():
    from planner.specs.cluster import ClusterSpec, NodeGroup

    return ClusterSpec(name="c", node_groups=(
        NodeGroup(name="g0", gpu="A100-40GB-PCIe", num_nodes=1, island="ib-a"),
        NodeGroup(name="g1", gpu="A100-40GB-SXM", num_nodes=1, island="ib-a"),
    )).resolved()


def test_search_of_an_mlp_narrower_than_tp():
    model = ModelSpec(name="m", num_layers=4, hidden_size=2, ffn_hidden_size=1, num_heads=2,
                      num_kv_heads=1, vocab_size=1, seq_len=1, position_embedding="learned",
                      dropout=False)
    _outcome(model, parse_gpus_arg("A100-40GB-PCIe:8"), gbs=1)


def test_mixed_search_baseline_of_a_small_model():
    model = ModelSpec(name="m", num_layers=7, hidden_size=120, ffn_hidden_size=48,
                      num_heads=24, num_kv_heads=3, vocab_size=2203, seq_len=18,
                      norm="rmsnorm", position_embedding="learned", dropout=False)
    _outcome(model, _two_a100_types(), gbs=24)


def test_mixed_search_explains_nothing_fits():
    model = ModelSpec(name="m", num_layers=4, hidden_size=816, ffn_hidden_size=48,
                      num_heads=24, num_kv_heads=3, vocab_size=798, seq_len=1069,
                      norm="rmsnorm", position_embedding="learned")
    _outcome(model, _two_a100_types(), gbs=1)
