"""Malformed files for every file the CLI reads (issue 15): model, cluster and plan files
(YAML and JSON) and profile CSVs, given to every command that reads them. YAML whose
aliases expand to billions of nodes, python tags, binary garbage, huge numbers, NaN and
infinity, empty files, folders for files, unicode: each ends in one line and exit 2, in
bounded CPU time (and, for the alias bomb, bounded memory). There is no user catalog
file: the device catalog is package data (profiler/data/), read by the same loader."""

from __future__ import annotations

import os
import pathlib
import resource
import subprocess
import sys

import pytest

from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import plan_to_dict
from profiler import schema
from tests.planner.properties import cpu_budget

ROOT = pathlib.Path(__file__).resolve().parents[2]
DGX = str(ROOT / "cluster_specs" / "dgx-h100.yaml")
PROFILE = ROOT / "profiles" / "cpu-debug-tiny.csv"

LAUGHS = "\n".join(
    ['a: &a ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    + [f"{b}: &{b} [{', '.join(['*' + a] * 9)}]"
       for a, b in zip("abcdefgh", "bcdefghi", strict=True)]
    + ["name: *i"]).encode()

# name -> bytes of a file that no loader may accept (each must be one line, exit 2)
HOSTILE = {
    "billion-laughs": LAUGHS,
    "self-alias": b"name: &a [*a]\n",
    "python-tag": b"name: !!python/object/apply:os.system ['touch pwned']\n",
    "python-name": b"name: !!python/name:os.system\n",
    "binary": bytes(range(256)) * 4,
    "nul-bytes": b"name: a\x00b\n",
    "not-utf8": "name: caf\u00e9\n".encode("latin-1"),
    "utf16": "name: x\n".encode("utf-16"),
    "empty": b"",
    "only-a-comment": b"# nothing here\n",
    "a-list": b"- 1\n- 2\n",
    "a-scalar": b"42\n",
    "deep": b"[" * 50_000 + b"]" * 50_000,
    "huge-int": b"name: m\nnum_layers: " + b"9" * 5000 + b"\n",
    "tabs": b"name:\tm\n\tnum_layers: 2\n",
    "unbalanced": b"name: [a, b\n",
    "unicode": "name: \u202e\U0001f600\nnum_layers: \u0663\n".encode(),
}


def _model(**fields) -> bytes:
    import yaml

    base = {"name": "m", "num_layers": 4, "hidden_size": 256, "ffn_hidden_size": 1024,
            "num_heads": 4, "vocab_size": 1000, "seq_len": 512}
    return yaml.safe_dump({**base, **fields}).encode()


def _cluster(**group) -> bytes:
    import yaml

    g = {"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 1, **group}
    return yaml.safe_dump({"name": "c", "node_groups": [g]}).encode()


def _plan(edit) -> bytes:
    import yaml

    plan = homogeneous_plan(preset("gpt3-125m"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(tp=1, pp=2, dp=4, mbs=1, gbs=8, seq_len=512))
    data = plan_to_dict(plan)
    edit(data)
    return yaml.safe_dump(data).encode()


MODELS = {
    "num-layers-1e26": _model(num_layers=10**26),
    "hidden-1e26": _model(hidden_size=10**26),
    "nan-vocab": b"name: m\nnum_layers: 2\nhidden_size: 64\nffn_hidden_size: 64\n"
                 b"num_heads: 1\nvocab_size: .nan\nseq_len: 8\n",
    "inf-seq": _model(seq_len=float("inf")),
    "float-layers": _model(num_layers=2.5),
}
CLUSTERS = {
    "nic-1e-300": _cluster(nic_bandwidth_gbit_per_s=1e-300),
    "nan-bandwidth-and-price": _cluster(nic_bandwidth_gbit_per_s=float("nan"),
                                        price_per_gpu_hour_usd=float("nan")),
    "million-nodes": _cluster(num_nodes=1_000_000),
    "inf-latency": b"name: c\nnode_groups:\n- {name: a, gpu: A100-80GB-SXM, num_nodes: 1, "
                   b"island: x}\n- {name: b, gpu: A100-80GB-SXM, num_nodes: 1, island: y}\n"
                   b"island_links:\n- {islands: [x, y], bandwidth_gbit_per_s: 100, "
                   b"latency_ms: .inf}\n",
    "unknown-gpu": _cluster(gpu="\U0001f600"),
}
PLANS = {
    "gbs-1e9": _plan(lambda d: d["training"].update(global_batch_size=10**9)),
    "nan-time": _plan(lambda d: d.update(predicted={
        "iteration_time_s": float("nan"), "tokens_per_s": 1.0, "tflops_per_gpu_model": 1.0,
        "mfu": 0.1, "peak_memory_bytes": [1]})),
    "bf16-on-v100": _plan(lambda d: d["cluster"]["node_groups"][0].update(
        gpu="V100-32GB-SXM2")),
    "devices-huge": _plan(lambda d: d["pipelines"][0]["stages"][0].update(
        devices=[10**30])),
    "json-nan": b'{"schema_version": NaN}',
}
PROFILES = {
    "garbage-row": PROFILE.read_bytes() + b"\x00\x01,,,\n",
    "no-header": b"# schema_version: 1\n",
}


def _nan_time_profile() -> bytes:
    lines = PROFILE.read_text().splitlines()
    header = next(i for i, ln in enumerate(lines) if ln.startswith("kind,"))
    cells = lines[header + 1].split(",")
    cells[lines[header].split(",").index("time_s")] = "nan"
    lines[header + 1] = ",".join(cells)
    return ("\n".join(lines) + "\n").encode()


PROFILES["nan-row"] = _nan_time_profile()


def _commands(kind: str, path: str, out: str) -> list[list[str]]:
    layout = ["--tp", "1", "--pp", "1", "--dp", "8", "--mbs", "1", "--gbs", "8"]
    if kind == "model":
        return [["simulate", "--model-file", path, "--gpus", "A100-80GB-SXM:8", *layout],
                ["search", "--model-file", path, "--gpus", "A100-80GB-SXM:8", "--gbs", "8"],
                ["what-if", "--model-file", path, "--cluster", DGX, "--tokens", "1e9",
                 "--gbs", "8", "-o", out],
                ["run", "--model-file", path, "--gpus", "CPU:2", "--gbs", "8", "--dry-run"]]
    if kind == "cluster":
        return [["simulate", "--model", "gpt3-125m", "--cluster", path, *layout],
                ["search", "--model", "gpt3-125m", "--cluster", path, "--gbs", "8"],
                ["what-if", "--model", "gpt3-125m", "--cluster", path, "--tokens", "1e9",
                 "--gbs", "8", "-o", out],
                ["run", "--model", "debug-tiny", "--cluster", path, "--gbs", "8",
                 "--dry-run"]]
    if kind == "plan":
        return [["simulate", "--plan", path], ["export", path, "--format", "megatron"],
                ["run", "--plan", path, "--dry-run"]]
    return [["simulate", "--model", "debug-tiny", "--gpus", "CPU:1", "--tp", "1", "--pp", "1",
             "--dp", "1", "--mbs", "8", "--gbs", "8", "--dtype", "fp32", "--profile", path],
            ["profile", "show", path], ["profile", "fit", path]]


CASES = ([(k, name, body) for k in ("model", "cluster", "plan", "profile")
          for name, body in HOSTILE.items()]
         + [("model", n, b) for n, b in MODELS.items()]
         + [("cluster", n, b) for n, b in CLUSTERS.items()]
         + [("plan", n, b) for n, b in PLANS.items()]
         + [("profile", n, b) for n, b in PROFILES.items()])


def _call(argv, capsys):
    from planner.cli import main

    with cpu_budget(20):
        try:
            code = main(argv)
        except SystemExit as exit_:
            code = exit_.code
    return (code, *capsys.readouterr())


@pytest.mark.parametrize("kind, name, body", CASES, ids=[f"{k}-{n}" for k, n, _ in CASES])
def test_every_reader_refuses_in_one_line(tmp_path, monkeypatch, capsys, kind, name, body):
    pytest.importorskip("torch")  # `plan run` and `plan profile` need it installed
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("TRAINPLAN_PROGRESS", "never")
    ext = {"profile": ".csv", "plan": ".json" if name.startswith("json") else ".yaml"}
    path = str(tmp_path / f"input{ext.get(kind, '.yaml')}")
    pathlib.Path(path).write_bytes(body)
    for argv in _commands(kind, path, str(tmp_path / "report")):
        code, out, err = _call(argv, capsys)
        assert code == 2, (argv, code, out, err)
        assert err.count("\n") == 1 and "Traceback" not in err, (argv, err)
        assert len(err) < 600, (argv, err)
        assert path in err or "argument" in err or "--" in err, (argv, err)
    assert sorted(os.listdir(tmp_path)) == [os.path.basename(path)]  # nothing written, no
    # `pwned` file from a python tag


@pytest.mark.parametrize("kind", ["model", "cluster", "plan", "profile"])
def test_a_folder_or_a_missing_file(tmp_path, capsys, kind):
    pytest.importorskip("torch")
    (tmp_path / "folder.yaml").mkdir()
    for path in (str(tmp_path / "folder.yaml"), str(tmp_path / "missing.yaml")):
        for argv in _commands(kind, path, str(tmp_path / "report")):
            if kind == "profile" and argv[0] == "simulate" and "folder" in path:
                continue  # a folder of profiles is what --profile takes
            code, _, err = _call(argv, capsys)
            assert code == 2 and err.count("\n") == 1, (argv, err)
            assert "cannot read" in err, (argv, err)


def test_a_file_past_the_size_limit(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(schema, "MAX_FILE_BYTES", 1024)
    path = tmp_path / "big.yaml"
    path.write_bytes(_model() + b"#" * 2048 + b"\n")
    code, _, err = _call(_commands("model", str(path), str(tmp_path / "r"))[0], capsys)
    assert code == 2 and "larger than" in err, err


def test_the_alias_bomb_in_bounded_memory(tmp_path):
    """In a fresh process limited to 1 GiB of address space and 20 CPU-seconds (the bomb
    took 47 s and 6.2 GB before)."""
    path = tmp_path / "m.yaml"
    path.write_bytes(LAUGHS)

    def limits():
        resource.setrlimit(resource.RLIMIT_AS, (1 << 30, 1 << 30))
        resource.setrlimit(resource.RLIMIT_CPU, (20, 20))

    proc = subprocess.run(
        [sys.executable, "-m", "planner.cli", "simulate", "--model-file", str(path), "--gpus",
         "A100-80GB-SXM:8", "--tp", "1", "--pp", "1", "--dp", "8", "--mbs", "1", "--gbs", "8"],
        capture_output=True, text=True, preexec_fn=limits, timeout=120, cwd=ROOT)
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip() == (f"plan simulate: error: {path}: YAML aliases expand to "
                                   "more than 1,000,000 values (not allowed)")


@pytest.mark.parametrize("argv, needle", [
    (["simulate", "--plan", "{cluster}"], "a cluster file is not allowed here (a plan file has"),
    (["export", "{cluster}", "--format", "megatron"], "a cluster file is not allowed here"),
    (["gpus", "--catalog", "{cluster}"], "'a cluster file' is not allowed (a catalog file"),
    # a model file named a cluster's `description` ("unknown field; known: ..." of 32
    # names); a cluster flag a model's (CLI audit, 2026-12-06)
    (["search", "--model-file", "{cluster}", "--gpus", "CPU:1", "--gbs", "1"],
     "a cluster file is not allowed here (a model file has `name`, `num_layers`"),
    (["search", "--model", "debug-tiny", "--cluster", "{model}", "--gbs", "1"],
     "a model file is not allowed here (a cluster file has `name` and `node_groups`: a "
     "plan's `cluster:` section is one; a model goes to --model-file)"),
    (["simulate", "--model", "debug-tiny", "--gpus", "CPU:1", "--tp", "1", "--pp", "1", "--dp",
      "1", "--mbs", "1", "--gbs", "1", "--profile", "{cluster}"],
     "is not allowed (a trainplan profile"),
])
def test_a_file_of_another_kind_says_what_it_is(tmp_path, capsys, argv, needle):
    """A cluster file given for a plan named a field the plan lacks ("island_links: ...
    unknown field"), for a catalog a GPU type called 'name', for a profile its schema
    version (sweep of 2026-12-03)."""
    cluster = tmp_path / "two.yaml"
    cluster.write_text("name: two\nnode_groups:\n  - {name: a, gpu: CPU, num_nodes: 1}\n")
    model = tmp_path / "m.yaml"
    model.write_text("name: m\nnum_layers: 1\nhidden_size: 8\nnum_heads: 2\n"
                     "ffn_hidden_size: 8\nvocab_size: 8\nseq_len: 4\n")
    code, out, err = _call([a.format(cluster=cluster, model=model) for a in argv], capsys)
    assert code == 2 and needle in err and err.count("\n") == 1, err
