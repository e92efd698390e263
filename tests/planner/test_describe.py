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
