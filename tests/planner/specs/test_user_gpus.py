"""GPUs outside the catalog: defined inline in a cluster file, or in a --catalog file that
adds to the catalog or overrides its entries; a plan carries the numbers it was made with."""

import re

import pytest

from planner.specs.cluster import load_cluster
from planner.specs.plan import load_plan
from profiler.schema import SpecError
from tests.planner.cli_helpers import run_cli

LAB = """name: lab
devices:
  - name: Lab-GPU-24GB
    vendor: nvidia
    arch: ampere
    memory_gib: 24
    memory_bandwidth_gb_per_s: 900
    num_compute_units: 80
    peak_tflops: {fp32: 30, tf32: 30, fp16: 70, bf16: 70}
    intra_node_link: pcie
    intra_node_bandwidth_gb_per_s: 16
node_groups:
  - {name: lab, gpu: Lab-GPU-24GB, num_nodes: 2, gpus_per_node: 4, nic: ethernet,
     nics_per_node: 1, nic_bandwidth_gbit_per_s: 10}
"""
FLAGS = ["--tp", "1", "--pp", "2", "--dp", "4", "--mbs", "2", "--gbs", "64", "--json"]


def _iteration(out):
    import json

    return json.loads(out)["iteration_time_s"]


def test_a_cluster_file_defines_its_own_gpu(tmp_path, capsys):
    path = tmp_path / "lab.yaml"
    path.write_text(LAB)
    cluster = load_cluster(str(path))
    assert cluster.node_groups[0].device.memory_gib == 24
    plan_path = tmp_path / "plan.yaml"
    code, out, err = run_cli(["simulate", "--model", "gpt3-350m", "--cluster", str(path),
                              *FLAGS, "-o", str(plan_path)], capsys)
    assert code == 0, err
    plan = load_plan(str(plan_path))  # the plan carries the GPU's numbers
    assert plan.cluster.node_groups[0].device.peak_tflops["bf16"] == 70
    code, again, err = run_cli(["simulate", "--plan", str(plan_path), "--json"], capsys)
    assert code == 0 and _iteration(again) == _iteration(out), err


def test_a_plan_file_may_define_its_gpu_under_the_clusters_devices(tmp_path, capsys):
    """A plan's cluster names its GPU in `devices` without a `gpu_spec` on the group (a
    hand-written plan, or one with the copy removed), every node field given: it was
    taken as resolved and the GPU looked up in the catalog ("'Lab-GPU-24GB' is not a
    known GPU type")."""
    import yaml

    path = tmp_path / "lab.yaml"
    path.write_text(LAB)
    plan_path = tmp_path / "plan.yaml"
    code, out, err = run_cli(["simulate", "--model", "gpt3-350m", "--cluster", str(path),
                              *FLAGS, "-o", str(plan_path)], capsys)
    assert code == 0, err
    doc = yaml.safe_load(plan_path.read_text())
    for group in doc["cluster"]["node_groups"]:
        group.pop("gpu_spec")
    assert doc["cluster"]["devices"]  # the definition stays where a cluster file has it
    plan_path.write_text(yaml.safe_dump(doc))
    code, again, err = run_cli(["simulate", "--plan", str(plan_path), "--json"], capsys)
    assert code == 0 and _iteration(again) == _iteration(out), err


@pytest.mark.parametrize("edit, message", [
    (lambda t: t.replace("gpu: Lab-GPU-24GB", "gpu: Lab-GPU-48GB"),
     r"node_groups\[0\].gpu: 'Lab-GPU-48GB' is not a known GPU type .*define it under"),
    (lambda t: t.replace(" nic_bandwidth_gbit_per_s: 10", ""),
     r"node_groups\[0\].nic_bandwidth_gbit_per_s: missing \(GPU type 'Lab-GPU-24GB' "
     "defines no standard node"),
    (lambda t: t.replace("arch: ampere", "arch: quantum"),
     r"devices\[0\].arch: 'quantum' is not allowed \(a known architecture"),
    (lambda t: t.replace("memory_gib: 24", "memory_gib: -1"), r"devices\[0\].memory_gib"),
    # numbers beyond any device, which overflowed or priced steps at 1e30 s
    (lambda t: t.replace("memory_gib: 24", "memory_gib: 1e300"),
     r"devices\[0\].memory_gib: 1e\+300 is not allowed \(must be ≤ 1,048,576\)"),
    # a GPU joined by loopback (a CPU host's link): a cluster file refused it, a catalog not
    (lambda t: t.replace("intra_node_link: pcie", "intra_node_link: loopback"),
     r"devices\[0\].intra_node_link: 'loopback' is not allowed \(loopback for a CPU host's "
     r"processes, and only for them\)"),
    # a memory of no whole byte divided by zero in plan simulate's memory line
    (lambda t: t.replace("memory_gib: 24", "memory_gib: 1e-300"),
     r"devices\[0\].memory_gib: 1e-300 is not allowed \(must be ≥ 0.01\)"),
    (lambda t: t.replace("fp16: 70,", "fp16: 1e-300,"),
     r"devices\[0\].peak_tflops.fp16: 1e-300 is not allowed \(must be 0.001 to 1,000,000\)"),
    (lambda t: t.replace("num_compute_units: 80", "num_compute_units: 1000000000000"),
     r"devices\[0\].num_compute_units: 1000000000000 is not allowed \(must be ≤ 1,000,000\)"),
    # a standard node without NICs divided by zero (a node group needs 1 to 64)
    (lambda t: t.replace("    intra_node_bandwidth_gb_per_s: 16\n", "    intra_node_bandwidth_gb_per_s: 16\n"
                         "    node: {name: box, gpus_per_node: 4, nics_per_node: 0}\n"),
     r"devices\[0\].node.nics_per_node: 0 is not allowed \(must be ≥ 1\)"),
])
def test_a_bad_definition_is_one_line(tmp_path, edit, message):
    path = tmp_path / "lab.yaml"
    path.write_text(edit(LAB))
    with pytest.raises(SpecError, match=message):
        load_cluster(str(path))


def test_a_catalog_file_overrides_an_entry_for_every_command(tmp_path, capsys):
    """`--catalog` with a slower A100 (half the tensor peak) predicts a slower step."""
    import yaml

    from profiler.devices import device
    from profiler.schema import dump

    entry = {k: v for k, v in dump(device("A100-80GB-SXM")).items() if k != "name"}
    entry["peak_tflops"] = {k: v / 2 for k, v in entry["peak_tflops"].items()}
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"A100-80GB-SXM": entry}))
    argv = ["simulate", "--model", "gpt3-1.3b", "--gpus", "A100-80GB-SXM:8", "--tp", "1",
            "--pp", "2", "--dp", "4", "--mbs", "2", "--gbs", "64", "--json"]
    code, shipped, _ = run_cli(argv, capsys)
    code2, slower, err = run_cli([*argv, "--catalog", str(catalog)], capsys)
    assert code == code2 == 0, err
    assert _iteration(slower) > 1.3 * _iteration(shipped)
    code, listing, _ = run_cli(["gpus", "--catalog", str(catalog)], capsys)
    assert re.search(r"A100-80GB-SXM +80\.0GiB +- +156\.0TF +156\.0TF +78\.0TF", listing)


def test_a_catalog_type_joins_a_gpus_list_and_its_plan_carries_it(tmp_path, capsys):
    """A --catalog type beside a shipped one in `--gpus A,B`: both in their standard
    nodes, and the plan written holds the new type's numbers (it runs again without the
    catalog file)."""
    import yaml

    from profiler.devices import device
    from profiler.schema import dump

    entry = {k: v for k, v in dump(device("A100-80GB-SXM")).items() if k != "name"}
    entry["memory_gib"] = 40
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"Lab-A100-40GB": entry}))
    plan_path = tmp_path / "plan.yaml"
    code, out, err = run_cli(["simulate", "--model", "gpt3-125m", "--gpus",
                              "Lab-A100-40GB:8,V100-32GB-SXM2:8", "--catalog", str(catalog),
                              "--tp", "1", "--pp", "2", "--dp", "8", "--mbs", "1", "--gbs",
                              "32", "--seq", "1024", "--json", "-o", str(plan_path)], capsys)
    assert code == 0, err
    plan = load_plan(str(plan_path))
    assert [(g.gpu, g.device.memory_gib) for g in plan.cluster.node_groups] == [
        ("Lab-A100-40GB", 40), ("V100-32GB-SXM2", 32)]
    code, again, err = run_cli(["simulate", "--plan", str(plan_path), "--json"], capsys)
    assert code == 0 and _iteration(again) == _iteration(out), err


def test_a_catalog_entry_for_a_shipped_type_may_give_only_what_it_changes(tmp_path, capsys):
    """{A100-80GB-SXM: {memory_gib: 40}}: the 40 GB memory over the shipped entry's fields
    (was: refused for every field it left out)."""
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("A100-80GB-SXM: {memory_gib: 40}\n")
    code, listing, err = run_cli(["gpus", "--catalog", str(catalog)], capsys)
    assert code == 0, err
    assert re.search(r"A100-80GB-SXM +40\.0GiB +- +312\.0TF +312\.0TF +156\.0TF", listing)
    # a `name` other than the key renamed the type behind the user's back
    catalog.write_text("A100-80GB-SXM: {name: A100-RENAMED, memory_gib: 40}\n")
    code, _, err = run_cli(["gpus", "--catalog", str(catalog)], capsys)
    assert code == 2 and "A100-80GB-SXM.name: 'A100-RENAMED' is not allowed (the entry's key" in err
    catalog.write_text("Z100: {memory_gib: 40}\n")  # a new type still needs every field
    code, _, err = run_cli(["gpus", "--catalog", str(catalog)], capsys)
    assert code == 2 and "Z100.vendor: missing" in err


def test_a_catalog_override_of_a_mapping_keeps_the_keys_it_leaves_out(tmp_path):
    """{peak_tflops: {bf16: 400}} replaced the whole mapping: the A100 lost its fp32,
    tf32 and fp16 peaks, and fp16 was then "not offered" (sweep of 2026-12-03)."""
    from profiler.devices import device, load_catalog

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("A100-80GB-SXM: {peak_tflops: {bf16: 400}}\n")
    peaks = load_catalog(str(catalog))["A100-80GB-SXM"].peak_tflops
    assert peaks == {**device("A100-80GB-SXM").peak_tflops, "bf16": 400}


def test_a_catalog_naming_one_type_twice_is_refused(tmp_path):
    """In two cases: the later entry won without a word (a cluster's `devices` refused
    the same file)."""
    from profiler.devices import load_catalog

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("a100-80gb-sxm: {memory_gib: 40}\nA100-80GB-SXM: {memory_gib: 20}\n")
    with pytest.raises(SpecError, match=r"A100-80GB-SXM: 'A100-80GB-SXM' is not allowed \(one "
                                        r"entry a type: 'a100-80gb-sxm' names it too"):
        load_catalog(str(catalog))


@pytest.mark.parametrize("text", [
    "devices:\n  MY-GPU: {vendor: nvidia, arch: hopper, memory_gib: 80}\n",
    "devices:\n  - {name: MY-GPU, vendor: nvidia, arch: hopper, memory_gib: 80}\n"])
def test_a_catalog_with_a_clusters_devices_section_says_where_the_types_go(tmp_path, text):
    """A cluster file's `devices:` section copied into a catalog file: "devices" was read
    as a GPU type, and its types as unknown fields of it ("devices.MY-GPU: {...} is not
    allowed (unknown field ...)"), or a list where fields go."""
    from profiler.devices import load_catalog

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(text)
    with pytest.raises(SpecError, match=r"catalog.yaml:devices: 'devices' is not allowed \(a "
                                        r"catalog file names its GPU types at the top level, "
                                        r"without `devices:`"):
        load_catalog(str(catalog))


def test_a_gpu_type_named_devices_is_still_a_gpu_type(tmp_path):
    from profiler.devices import load_catalog

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text("devices: {vendor: nvidia, arch: hopper, memory_gib: 80, "
                       "memory_bandwidth_gb_per_s: 3000, num_compute_units: 132, "
                       "peak_tflops: {bf16: 900}}\n")
    assert load_catalog(str(catalog))["devices"].memory_gib == 80


@pytest.mark.parametrize("field, value", [
    ("gemm_efficiency", "1e-300"), ("gemm_tile_m", "1000000000000"),
    ("kernel_overhead_us", "1e300"), ("small_tile_penalty", "1e300")])
def test_efficiency_values_beyond_any_device_are_refused(tmp_path, field, value):
    """Each priced an iteration at 1e296 s or inf (a tile of 1e400 divided by zero)."""
    import yaml

    from profiler.devices import arch_efficiency, load_catalog
    from profiler.schema import dump

    eff = dump(arch_efficiency("ampere"))
    eff[field] = float(value) if "." in value or "e" in value else int(value)
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(yaml.safe_dump({"A100-80GB-SXM": {"efficiency": eff}}))
    with pytest.raises(SpecError, match=rf"efficiency.{field}: .* is not allowed"):
        load_catalog(str(catalog))


@pytest.mark.parametrize("key", ["A100-80GB-SXM", "a100-80gb-sxm"])
@pytest.mark.parametrize("where", ["--gpus", "--cluster", "devices"])
def test_gpu_names_match_in_any_case(tmp_path, capsys, key, where):
    """GPU types are looked up in any case (`device`); a --catalog override or a cluster's
    own definition applied only when the spelling matched exactly, so a lowercase name
    was silently priced with the shipped 80 GB."""
    argv = ["simulate", "--model", "gpt3-1.3b", "--tp", "1", "--pp", "1", "--dp", "8",
            "--mbs", "1", "--gbs", "8", "--json"]
    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(f"{key}: {{memory_gib: 40}}\n")
    cluster = tmp_path / "c.yaml"
    if where == "--gpus":
        argv += ["--gpus", "a100-80gb-sxm:8", "--catalog", str(catalog)]
    elif where == "--cluster":
        cluster.write_text("name: c\nnode_groups: [{name: a, gpu: a100-80gb-sxm, num_nodes: 1}]\n")
        argv += ["--cluster", str(cluster), "--catalog", str(catalog)]
    else:
        cluster.write_text(LAB.replace("name: Lab-GPU-24GB", f"name: {key.upper()}")
                           .replace("gpu: Lab-GPU-24GB", "gpu: a100-80gb-sxm")
                           .replace("memory_gib: 24", "memory_gib: 40"))
        argv += ["--cluster", str(cluster)]
    code, out, err = run_cli(argv, capsys)
    import json

    assert code == 0, err
    assert json.loads(out)["stages"][0]["memory"]["capacity_bytes"] == 40 * 2**30


def test_a_type_the_file_defines_is_named_in_any_case(tmp_path):
    path = tmp_path / "lab.yaml"
    path.write_text(LAB.replace("gpu: Lab-GPU-24GB", "gpu: lab-gpu-24gb"))
    (group,) = load_cluster(str(path)).node_groups
    assert group.gpu == "Lab-GPU-24GB" and group.device.memory_gib == 24
    twice = LAB.replace("devices:\n", "devices:\n  - {name: LAB-GPU-24GB, vendor: nvidia, "
                        "arch: ampere, memory_gib: 1, memory_bandwidth_gb_per_s: 1, "
                        "num_compute_units: 1, peak_tflops: {fp32: 1}}\n")
    path.write_text(twice)
    with pytest.raises(SpecError, match=r"devices\[1\].name: 'Lab-GPU-24GB' is not allowed "
                                        r"\(defined twice"):
        load_cluster(str(path))


def test_a_cluster_file_may_use_a_type_the_catalog_file_defines(tmp_path, capsys):
    """--cluster FILE --catalog CAT: the cluster was checked before the catalog was read,
    so a type only CAT defines was 'not a known GPU type'."""
    import yaml

    lab = yaml.safe_load(LAB)
    (device_entry,) = lab.pop("devices")
    name = device_entry.pop("name")
    device_entry["node"] = {"name": "box", "gpus_per_node": 4, "nics_per_node": 1}
    catalog, cluster = tmp_path / "cat.yaml", tmp_path / "c.yaml"
    catalog.write_text(yaml.safe_dump({name: device_entry}))
    cluster.write_text(yaml.safe_dump(lab))
    argv = ["simulate", "--model", "gpt3-350m", "--cluster", str(cluster), *FLAGS]
    code, _, err = run_cli(argv, capsys)
    assert code == 2 and "'Lab-GPU-24GB' is not a known GPU type" in err
    code, out, err = run_cli([*argv, "--catalog", str(catalog)], capsys)
    assert code == 0, err


def test_profile_fit_writes_a_catalog_file(tmp_path, capsys):
    """`plan profile fit -o` writes the profiled type with its fitted parameters, which
    --catalog then uses (no editing of package data)."""
    from profiler.devices import load_catalog

    out = tmp_path / "cpu.yaml"
    code, text, err = run_cli(["profile", "fit", "profiles/cpu-debug-tiny.csv",
                               "--iterations", "30", "-o", str(out)], capsys)
    assert code == 0, err
    fitted = load_catalog(str(out))["CPU"]
    assert fitted.efficiency is not None and "fitted to profiles/cpu-debug-tiny.csv" in \
        fitted.source


def test_the_gpus_table_shows_each_precision_apart(capsys):
    """One 'bf16/fp16' column showed a V100's fp16 peak with no word that it has no bf16,
    and a CPU's 0.05 TFLOP/s as 0.1; which GPUs take `--dtype fp8` or run tf32 on tensor
    cores showed only in --json."""
    code, listing, _ = run_cli(["gpus"], capsys)
    assert code == 0
    assert listing.split()[:7] == ["name", "memory", "fp8", "bf16", "fp16", "tf32", "fp32"]
    assert re.search(r"^V100-32GB-SXM2 +32\.0GiB +- +- +125\.0TF +- +15\.7TF", listing, re.M)
    assert re.search(r"^H100-80GB-SXM +\S+ +1978\.9TF +989\.4TF +989\.4TF +494\.7TF +67\.0TF",
                     listing, re.M)
    assert re.search(r"^CPU +\S+ +- +0\.05TF +0\.02TF +- +0\.1TF .* 64 ranks on loopback",
                     listing, re.M)  # CPU ranks, not "64 GPUs" (CLI audit, 2026-12-06)


def test_a_gpu_with_neither_tf32_nor_fp32_runs_no_tf32():
    # tf32 runs as fp32 where a GPU has no TF32; a GPU that defines only fp16 has
    # neither, yet '--dtype fp32' said it "offers tf32 (as fp32)" and '--dtype tf32'
    # passed the check, then failed further on as "dtype: 'fp32'".
    import dataclasses

    from planner.specs.cluster import check_train_dtype, runs_dtype
    from profiler.devices import device

    x1 = dataclasses.replace(device("A100-80GB-SXM"), name="X1", peak_tflops={"fp16": 100.0})
    assert not runs_dtype(x1, "tf32") and runs_dtype(device("V100-32GB-SXM2"), "tf32")
    for dtype in ("fp32", "tf32"):
        with pytest.raises(SpecError, match=f"--dtype: '{dtype}' is not allowed \\(X1 has no "
                           f"{dtype}; it offers fp16\\)"):
            check_train_dtype([x1], dtype, where="--dtype")


def test_a_gpu_with_no_default_dtype_asks_for_the_flag():
    """A type with only an fp8 peak and no --dtype was refused as `plan.training.dtype:
    'fp32'`, a field and value the user never wrote (sweep of 2026-12-03)."""
    import dataclasses

    from planner.specs.cluster import train_dtype
    from profiler.devices import device

    fp8_only = dataclasses.replace(device("H100-80GB-SXM"), name="MyGPU",
                                   peak_tflops={"fp8": 1979.0})
    with pytest.raises(SpecError, match=r"--dtype: missing is not allowed \(a dtype MyGPU "
                                        r"trains in, .*it offers fp8\)"):
        train_dtype([fp8_only], None, where="--dtype")
    assert train_dtype([fp8_only], "fp8", where="--dtype") == "fp8"


@pytest.mark.parametrize("attention", ["[]", "[flash, flash]"])
def test_a_devices_attention_list_is_its_own(tmp_path, attention):
    """`attention: []` fell back to the architecture's kernels without a word."""
    from profiler.devices import load_catalog

    catalog = tmp_path / "catalog.yaml"
    catalog.write_text(f"A100-80GB-SXM: {{attention: {attention}}}\n")
    with pytest.raises(SpecError, match=r"A100-80GB-SXM.attention: .* is not allowed \(the "
                                        r"backends it runs, each once"):
        load_catalog(str(catalog))
