"""Sailor's measured per-layer profiles against the cost model's layer
(planner/calibration/sailor_layers.py), held out: nothing is fitted to them."""

import pytest

from planner.calibration.sailor_layers import layer_rows


@pytest.fixture(scope="module")
def rows():
    return layer_rows()


def test_every_profiled_entry_is_priced(rows):
    """82 OPT-350M entries on four GPU types (tp up to a node: 4 GH200, 8 RTX) and 20
    GPT-Neo-2.7B entries on GH200, each a real layer time."""
    assert len(rows) == 102
    assert {(r.model, r.sailor_gpu) for r in rows} == {
        ("OPT-350M", g) for g in ("GH-96", "RTX-3090", "Titan-RTX", "RTX-2080")} | {
        ("GPT-Neo-2.7B", "GH-96")}
    assert {r.gpu for r in rows} == {"GH200-96GB", "RTX3090-24GB", "TitanRTX-24GB",
                                     "RTX2080Ti-11GB"}
    assert all(r.measured_forward_s > 0 and r.measured_backward_s > 0 for r in rows)
    assert all(r.forward.tp_s == 0 for r in rows if r.tp == 1)
    assert all(r.forward.tp_s > 0 for r in rows if r.tp > 1)


def test_the_layer_is_right_where_it_is_compute_bound_on_one_gpu(rows):
    """Where one GH200 runs the layer at micro-batch 4 or more (compute-bound, no tp), the
    OPT-350M forward is within 10% of Sailor's measurement (0.92-0.96 on 2026-12-07) and
    GPT-Neo-2.7B's forward + backward within 15% (0.86-0.95)."""
    opt = [r for r in rows if r.model == "OPT-350M" and r.sailor_gpu == "GH-96"
           and r.tp == 1 and r.mbs >= 4]
    neo = [r for r in rows if r.model == "GPT-Neo-2.7B" and r.tp == 1 and r.mbs >= 4]
    assert len(opt) == 4 and len(neo) == 4
    assert all(abs(r.forward_ratio - 1) <= 0.10 for r in opt), [r.forward_ratio for r in opt]
    assert all(abs(r.ratio - 1) <= 0.15 for r in neo), [r.ratio for r in neo]


def test_the_gh200_layer_is_right_at_every_tp_where_it_is_compute_bound(rows):
    """At micro-batch 8 or more, every GH200 entry of both models, at tp 1, 2 and 4, is
    within 15% of Sailor's measurement forward + backward (0.86-0.98; at micro-batch 4 on
    tp 4, OPT's 1.8 ms forward is partly the host's, 0.85). Two mechanisms make
    it so (docs/calibration.md, "Sailor: the fp32 softmax backward and the GH200 mesh"):
    the fp32 attention's backward as autograd runs it (OPT's backward was 0.51-0.60 of
    the measurement) and the quad GH200's full NVLink mesh (tp 4 forward 1.34-1.56);
    GPT-Neo's entries are priced with the 20 heads Sailor's profiler built
    (sailor_layers._PROFILED_HEADS)."""
    gh = [r for r in rows if r.sailor_gpu == "GH-96" and r.mbs >= 8]
    assert {(r.model, r.tp) for r in gh} == {(m, tp) for m in ("OPT-350M", "GPT-Neo-2.7B")
                                             for tp in (1, 2, 4)}
    assert all(abs(r.ratio - 1) <= 0.15 for r in gh), \
        [(r.model, r.mbs, r.tp, round(r.ratio, 2)) for r in gh if abs(r.ratio - 1) > 0.15]


def test_the_rtx_2080_is_a_2080_ti(rows):
    """Sailor's "RTX-2080" runs its fp32 layer at 0.95 of the Titan RTX's speed (8.13 /
    7.75 ms forward at micro-batch 1), which an RTX 2080 (10.1 TFLOP/s, 448 GB/s) cannot:
    priced as one, its entries were 1.28-1.44x the measurement at tp 1-2 where the Titan
    RTX's are 0.98. Sailor's cluster config gives the card 11 GiB: an RTX 2080 Ti
    (sailor.SAILOR_GPUS). Priced as that, tp 1 and 2 are within 10%, like the Titan's."""
    import statistics

    for gpu in ("RTX-2080", "Titan-RTX"):
        for tp in (1, 2):
            group = [r.ratio for r in rows if r.sailor_gpu == gpu and r.tp == tp]
            assert abs(statistics.median(group) - 1) <= 0.10, (gpu, tp, group)
    assert {r.gpu for r in rows if r.sailor_gpu == "RTX-2080"} == {"RTX2080Ti-11GB"}
