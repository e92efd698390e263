"""What the property-based CLI tests found in planner/predict: regression tests of crashes
and wrong numbers that are fixed (each was a strict expected failure until then)."""


from planner.costs.kernels import default_kernels
from planner.predict.estimate import estimate
from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import ModelSpec


def test_the_closed_form_never_reports_a_negative_time():
    model = ModelSpec(name="m", num_layers=1, hidden_size=1, ffn_hidden_size=1, num_heads=1,
                      vocab_size=1, seq_len=2, position_embedding="learned", dropout=False)
    cluster = parse_gpus_arg("A100-80GB-PCIe:1")
    kernels = default_kernels([g.device for g in cluster.node_groups], attention=None)
    plan = homogeneous_plan(model, cluster, ParallelConfig(tp=1, pp=1, dp=1, mbs=1, gbs=1,
                                                           seq_len=2), kernels=kernels)
    b = estimate(plan).breakdown
    parts = {name: getattr(b, name) for name in ("compute_s", "host_overhead_s", "tp_comm_s",
                                                  "cp_comm_s", "pp_comm_s", "dp_comm_s",
                                                  "bubble_s", "optimizer_s")}
    assert all(v >= 0 for v in parts.values()), parts
