"""The notes on GPUs a mixed cluster's best plan leaves idle (`search._idle_notes`)."""

from pathlib import Path

from planner.search import SearchRequest, search
from planner.search.search import _idle_notes
from planner.specs.cluster import load_cluster
from planner.specs.model import preset

H100_L4 = """\
name: h100-l4
node_groups:
  - {name: h100, gpu: H100-80GB-SXM, num_nodes: 1}
  - {name: l4, gpu: L4-24GB, num_nodes: 1, gpus_per_node: 4}
"""


def test_every_time_in_an_idle_note_carries_its_unit(tmp_path: Path) -> None:
    """The L4s' mixed plans priced by the closed form only (not among the leaders
    simulated): the note gives both times in seconds, the best plan's too."""
    (path := tmp_path / "h100-l4.yaml").write_text(H100_L4)
    req = SearchRequest(model=preset("gpt3-1.3b"), cluster=load_cluster(str(path)), gbs=64,
                        seq_len=2048)
    found = search(req)
    ranked = [(r.result.iteration_time_s, r) for r in found.ranked
              if "L4-24GB" not in r.plan.gpu_types]
    closed_form_s_per_token = 2.0 / (req.gbs * req.seq_len)
    notes = _idle_notes(req, ranked, {"H100-80GB-SXM": [ranked[0][1]], "L4-24GB": []},
                        {"L4-24GB": closed_form_s_per_token}, True)
    (note,) = notes
    assert note.startswith("4 of 4 L4-24GB GPUs idle: every plan that uses them is slower: "
                           "at best 2 s/iteration by the closed form"), note
    assert note.endswith(f"the best plan simulates at {ranked[0][0]:.3g} s"), note
