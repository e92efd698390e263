"""Words the outputs share: large counts as a person says them (the report's title said
'1e+12 tokens')."""

from planner.describe import GLOSSARY, count_words


def test_counts_read_as_words() -> None:
    assert count_words(1e12) == "1 trillion"
    assert count_words(15e12) == "15 trillion"
    assert count_words(3e11) == "300 billion"
    assert count_words(2.5e9) == "2.5 billion"
    assert count_words(1.5e15) == "1,500 trillion"  # no '1.5e+03'
    assert count_words(123456) == "123,456"


def test_the_glossary_names_sharding_as_the_outputs_write_it() -> None:
    # the report writes 'optimizer states split over 256 replicas', tables 'optim 256'
    assert "optimizer states split over" in GLOSSARY["sharding"]
    assert "optim 256" in GLOSSARY["sharding"]


def test_gpu_types_are_shortened_only_as_far_as_they_stay_apart() -> None:
    """'A100-80GB-SXM' and 'A100-80GB-PCIe' were both 'A100' in a mixed plan's stages
    ('16x A100 tp2 x4 -> A100 tp1 x4'), and a plan on the two read as one type."""
    from planner.describe import gpu_short_names
    from planner.specs.cluster import load_cluster
    from planner.specs.layout import ParallelConfig, homogeneous_plan
    from planner.specs.model import preset

    plan = homogeneous_plan(preset("gpt3-1.3b"), load_cluster("cluster_specs/mixed-nic.yaml"),
                            ParallelConfig(tp=8, pp=1, dp=24, mbs=1, gbs=96, seq_len=2048))
    names = gpu_short_names(plan)
    assert names["A100-80GB-SXM"] == "A100-80GB-SXM"
    assert names["A100-80GB-PCIe"] == "A100-80GB-PCIe"
    three = homogeneous_plan(preset("gpt3-1.3b"),
                             load_cluster("cluster_specs/three-types.yaml"),
                             ParallelConfig(tp=8, pp=1, dp=20, mbs=1, gbs=80, seq_len=2048,
                                            dtype="fp16"))
    assert gpu_short_names(three) == {"H100-80GB-SXM": "H100", "A100-80GB-SXM": "A100",
                                      "V100-32GB-SXM2": "V100"}


def test_a_time_to_train_reads_in_the_unit_that_shows_it():
    # what-if printed every time in days with two decimals: a 90-second run read
    # "0.00 days" in the terminal and in report.md's headlines
    from planner.describe import duration_words

    assert duration_words(90) == "1.5 min"
    assert duration_words(0.85) == "0.85 s"
    assert duration_words(5 * 3600) == "5.0 h"
    assert duration_words(31.64 * 86400) == "31.64 days"


def test_the_search_tables_time_to_train_cell_shows_a_short_run():
    # the cell read "0.0 h" below six minutes
    from planner.search.show import _days

    assert _days(84.0) == "1.4 min" and _days(5 * 3600) == "5.0 h" and _days(2 * 86400) == "2.0 d"
