"""`plan simulate`: every bad input of issue 15 is one line and exit 2, before any work;
outputs are written whole or not at all."""

import json
import os

import pytest
import yaml

from planner.specs.cluster import parse_gpus_arg
from planner.specs.layout import ParallelConfig, homogeneous_plan
from planner.specs.model import preset
from planner.specs.plan import plan_to_dict
from tests.planner.cli_helpers import run_cli

CONFIG = ["--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--tp", "2", "--pp", "2",
          "--dp", "2", "--mbs", "4", "--gbs", "64"]


def _one_line(code, out, err, needle):
    assert code == 2 and out == "", (code, out, err)
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert needle in err, err


@pytest.mark.parametrize("flags, needle", [
    (["-o", "notes.txt"], "-o: 'notes.txt' is not allowed (a .yaml, .yml, .json file)"),
    (["-o", "missing/p.yaml"], "-o: 'missing/p.yaml' is not allowed (folder 'missing' does "
     "not exist)"),
    (["--trace", "missing/t.json"], "--trace: 'missing/t.json' is not allowed (folder"),
    (["--trace", "t.txt"], "--trace: 't.txt' is not allowed (a .json file)"),
    (["--gantt", "missing/g.png"], "--gantt: 'missing/g.png' is not allowed (folder"),
    (["--gantt", "g.txt"], "--gantt: 'g.txt' is not allowed (a .png, .svg, .pdf file)"),
    (["--gantt", "pictures"], "--gantt: 'pictures' is not allowed (a .png, .svg, .pdf file)"),
    (["--gantt", "pictures.png"], "--gantt: 'pictures.png' is not allowed (a file, not a folder)"),
    (["--trace", "same.json", "-o", "same.json"], "(the same file as -o)"),
    (["--trace", "t.json", "--method", "estimate"], "--trace and --gantt need the event"),
])
def test_bad_outputs_are_refused_before_work_and_touch_nothing(tmp_path, monkeypatch, capsys,
                                                               flags, needle):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "notes.txt").write_text("my notes")
    (tmp_path / "pictures").mkdir()
    (tmp_path / "pictures.png").mkdir()
    _one_line(*run_cli(["simulate", *CONFIG, *flags], capsys), needle)
    assert (tmp_path / "notes.txt").read_text() == "my notes"  # it was emptied, then refused
    assert sorted(os.listdir(tmp_path)) == ["notes.txt", "pictures", "pictures.png"]


def test_outputs_are_written_whole_with_no_temporary_left(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p.yaml").write_text("an older plan")
    code, out, err = run_cli(["simulate", *CONFIG, "-o", "p.yaml", "--trace", "t.json",
                              "--gantt", "g.svg", "--json"], capsys)
    assert code == 0, err
    assert sorted(os.listdir(tmp_path)) == ["g.svg", "p.yaml", "t.json"]
    assert json.loads((tmp_path / "t.json").read_text())["traceEvents"]
    assert yaml.safe_load((tmp_path / "p.yaml").read_text())["predicted"]["iteration_time_s"] > 0
    assert (tmp_path / "g.svg").read_text().lstrip().startswith("<?xml")


LAYOUT = CONFIG[4:]  # without --model and --gpus


@pytest.mark.parametrize("argv, needle", [
    (["--model-file", "", "--gpus", "A100-80GB-SXM:8", *LAYOUT],
     "argument --model-file: '' is not allowed (a file name)"),
    (["--model", "gpt3-1.3b", "--cluster", "", *LAYOUT],
     "argument --cluster: '' is not allowed (a file name)"),
    (["--plan", ""], "argument --plan: '' is not allowed (a file name)"),
    (["--model", "gpt3-1.3b", "--gpus", "CPU:²", *LAYOUT],
     "--gpus: 'CPU:²' is not allowed (expected TYPE:COUNT"),
    ([*CONFIG, "--gbs", "1000000000"],
     "argument --gbs: 1000000000 is not allowed (must be ≤ 65,536)"),
    ([*CONFIG, "--tp", "99999999999"],
     "argument --tp: 99999999999 is not allowed (must be ≤ 131,072)"),
    (["--model", "gpt3-125m", "--gpus", "CPU:2", "--tp", "1", "--pp", "2", "--dp", "1",
      "--mbs", "1", "--gbs", "1", "--vp", "2"],  # was the simulator's AssertionError
     "--vp: 2 is not allowed (interleaving needs micro-batches per pipeline (gbs/(mbs*dp) = 1) "
     "to be a multiple of pp = 2)"),
])
def test_bad_flags_are_one_line(capsys, argv, needle):
    _one_line(*run_cli(["simulate", *argv], capsys), needle)


def test_a_model_file_that_is_not_utf8_is_one_line(tmp_path, capsys):
    path = tmp_path / "m.yaml"
    path.write_bytes(b"name: \xc3\x28 broken")
    argv = ["simulate", "--model-file", str(path), *CONFIG[2:]]
    _one_line(*run_cli(argv, capsys), "m.yaml: not UTF-8 text (byte 0xc3 at offset 6)")


def test_simulate_plan_whose_cluster_takes_catalog_defaults(tmp_path, capsys):
    """issue 15: `AssertionError: resolve the cluster first`."""
    plan = homogeneous_plan(preset("gpt3-1.3b"), parse_gpus_arg("A100-80GB-SXM:8"),
                            ParallelConfig(tp=2, pp=2, dp=2, mbs=4, gbs=64, seq_len=2048))
    data = plan_to_dict(plan)
    data["cluster"]["node_groups"] = [{"name": "a", "gpu": "A100-80GB-SXM", "num_nodes": 1}]
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(data))
    code, out, err = run_cli(["simulate", "--plan", str(path), "--json"], capsys)
    assert code == 0, err
    assert json.loads(out)["iteration_time_s"] > 0


def test_bf16_on_v100_one_rule_for_flags_and_plans(tmp_path, capsys):
    """`simulate --dtype bf16` on V100 was refused while `simulate --plan` (and search)
    accepted bf16 there: now all refuse, naming the device."""
    v100 = ["--model", "gpt3-1.3b", "--gpus", "V100-32GB-SXM2:8", "--tp", "2", "--pp", "2",
            "--dp", "2", "--mbs", "4", "--gbs", "64"]
    rule = "'bf16' is not allowed (V100-32GB-SXM2 has no bf16; it offers fp32, fp16, tf32 (as fp32))"
    _one_line(*run_cli(["simulate", *v100, "--dtype", "bf16"], capsys), "--dtype: " + rule)
    path = tmp_path / "p.yaml"
    assert run_cli(["simulate", *v100, "--dtype", "fp16", "-o", str(path)], capsys)[0] == 0
    data = yaml.safe_load(path.read_text())
    data["training"]["dtype"] = "bf16"
    path.write_text(yaml.safe_dump(data))
    _one_line(*run_cli(["simulate", "--plan", str(path)], capsys),
              f"{path}:training.dtype: " + rule)
    search = ["search", "--model", "gpt3-1.3b", "--gpus", "V100-32GB-SXM2:8", "--gbs", "64"]
    _one_line(*run_cli([*search, "--dtype", "bf16"], capsys), "--dtype: " + rule)
    code, out, err = run_cli(search, capsys)  # the default there: fp16
    assert code == 0 and "V100-32GB-SXM2: gbs 64, seq 2048, fp16," in out, err


def test_an_event_simulation_of_minutes_is_refused_with_the_way_out(capsys):
    """gbs 65,536 on 8 pipeline stages: a million passes to schedule (minutes, gigabytes);
    the closed form answers at once."""
    argv = ["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--tp", "1",
            "--pp", "8", "--dp", "1", "--mbs", "1", "--gbs", "65536"]
    _one_line(*run_cli(argv, capsys), "--method: 'simulate' is not allowed (1,048,576 passes "
              "to schedule (at most 262,144, minutes of event simulation): use --method "
              "estimate")
    code, out, err = run_cli([*argv, "--method", "estimate", "--json"], capsys)
    assert code == 0 and json.loads(out)["iteration_time_s"] > 0, err


def test_tp_must_divide_the_mlp(tmp_path, capsys):
    """ffn_hidden_size 1 at tp 2 made a GEMM of width 0: ZeroDivisionError in the analytic
    device model (found by the property tests)."""
    path = tmp_path / "m.yaml"
    path.write_text("{name: m, num_layers: 1, hidden_size: 4, ffn_hidden_size: 1, num_heads: 2,"
                    " num_kv_heads: 1, vocab_size: 1, seq_len: 1}\n")
    _one_line(*run_cli(["simulate", "--model-file", str(path), "--gpus", "CPU:2", "--tp", "2",
                        "--pp", "1", "--dp", "1", "--mbs", "1", "--gbs", "1", "--seq", "64"],
                       capsys), "--tp: 2 is not allowed (must divide ffn_hidden_size 1)")


def test_a_key_or_name_with_control_characters_stays_one_line(tmp_path, capsys):
    """A plan with a key "\\r" gave a message that a terminal shows as two lines (found by
    the property tests); a right-to-left override could disguise one."""
    path = tmp_path / "p.yaml"
    path.write_text('"\\r": 1\n"\\u202e": 2\n')
    _one_line(*run_cli(["simulate", "--plan", str(path)], capsys), ":\\r: 1 is not allowed")
    odd = tmp_path / "a\nb.yaml"
    odd.write_text("{}")
    code, out, err = run_cli(["simulate", "--plan", str(odd)], capsys)
    assert code == 2 and err.count("\n") == 1 and "a\\nb.yaml" in err, err


def test_help_names_the_settings_only_a_plan_file_has(capsys):
    """`plan simulate --help` is where a user learns of `training.pipeline_flushes` and
    `training.master_weights`, which no flag sets, beside `--ep-layout`."""
    code, out, _ = run_cli(["simulate", "--help"], capsys)
    text = " ".join(out.split())  # argparse wraps lines
    assert code == 0
    assert "training.pipeline_flushes: pipeline schedules per step" in text
    assert "training.master_weights: false for 16-bit states without an fp32 master copy" in text
    assert "--ep-layout {folded,data_parallel}" in text


def test_json_names_what_was_simulated(capsys):
    """`--json` carries the layout line and the training settings beside the numbers, so
    that a script reading it knows which plan the numbers are of."""
    code, out, err = run_cli(["simulate", *CONFIG, "--json"], capsys)
    assert code == 0, err
    data = json.loads(out)
    assert data["layout"].startswith("tp 2, pp 2, dp 2"), data["layout"]
    assert data["training"]["global_batch_size"] == 64
    assert data["training"]["pipeline_flushes"] == 1 and data["training"]["ep"] == 1


def test_framework_prices_a_configuration_as_search_does(tmp_path, capsys):
    """`plan search` prices its plans with the framework's communication (trainplan by
    default), `plan simulate` from flags with Megatron-LM's: the same layout read 0.726 s
    in the search and 0.706 s in simulate, with no flag to match them."""
    search = ["search", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--gbs", "64",
              "--top", "1", "--json"]
    code, out, err = run_cli(search, capsys)
    assert code == 0, err
    best = json.loads(out)["plans"][0]
    assert (best["tp"], best["pp"], best["dp"]) == (1, 1, 8)
    flags = ["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--gbs", "64",
             "--tp", "1", "--pp", "1", "--dp", "8", "--mbs", str(best["mbs"]),
             "--shard-params", str(best["sharding"]["params"]),
             "--shard-grads", str(best["sharding"]["grads"]),
             "--shard-optim", str(best["sharding"]["optim"]), "--json"]
    code, out, err = run_cli([*flags, "--framework", "trainplan"], capsys)
    assert code == 0, err
    assert json.loads(out)["iteration_time_s"] == pytest.approx(best["iteration_time_s"],
                                                                rel=1e-9)
    code, out, err = run_cli(flags, capsys)  # Megatron-LM's communication: another number
    assert json.loads(out)["iteration_time_s"] != pytest.approx(best["iteration_time_s"],
                                                                rel=1e-3)
    # what the framework cannot run is refused, as search would never plan it
    _one_line(*run_cli(["simulate", *CONFIG, "--framework", "deepspeed"], capsys),
              "--framework: 'deepspeed' is not allowed (this configuration: tp 2 with pp 2")


def test_small_rates_keep_three_significant_digits():
    """A 1,024-layer model at 27,010 s an iteration printed `0 tokens/s, 0.0 per GPU`
    beside an MFU of 19.5% (spec sweep, 2026-12-04); a CPU rank's 0.0143 TFLOP/s printed
    0.0. Large rates print as before."""
    from planner.commands.simulate import _figure

    assert _figure(2048 / 27010, 0) == "0.0758" and _figure(0.0143, 1) == "0.0143"
    assert _figure(36373.2, 0) == "36,373" and _figure(18186.62, 1) == "18,186.6"
    assert _figure(312.0, 1) == "312.0" and _figure(0.0, 1) == "0.0"
