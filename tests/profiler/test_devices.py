import pytest

from profiler.devices import catalog, device, link_kind
from profiler.schema import SpecError

REQUIRED = ["V100-16GB-SXM2", "V100-32GB-SXM2", "V100-32GB-SXM3", "A100-40GB-SXM",
            "A100-80GB-SXM", "A100-40GB-PCIe", "A100-80GB-PCIe", "H100-80GB-SXM",
            "H100-80GB-PCIe", "H200-141GB-SXM", "GH200-96GB", "B200-180GB", "L4-24GB",
            "L40S-48GB", "A10G-24GB", "T4-16GB", "RTX4090-24GB", "A6000-48GB", "MI250X-128GB",
            "MI300X-192GB", "CPU"]


def test_catalog_has_every_required_type_with_source_and_node():
    table = catalog()
    for name in REQUIRED:
        d = table[name]
        assert d.source and d.node.gpus_per_node >= 1
        assert d.peak_flops("fp32") > 0 and d.memory_bytes > 0
        link_kind(d.intra_node_link)
        link_kind(d.node.nic)


def test_datasheet_numbers_spot_check():
    a100 = device("A100-80GB-SXM")
    assert a100.peak_flops("bf16") == 312e12
    assert a100.memory_bytes == 80 * 1024**3
    assert a100.node.gpus_per_node == 8 and a100.node.nics_per_node == 8
    assert a100.node.nic_bandwidth_gbit_per_s == 200 and a100.node.nic == "infiniband"
    assert device("h100-80gb-sxm").peak_flops("bf16") == pytest.approx(989.4e12)


def test_unknown_device_suggests_names():
    with pytest.raises(SpecError, match=r"gpu: 'A100-80G' is not a known GPU type \(did you mean"):
        device("A100-80G")


def test_missing_dtype_is_an_error():
    with pytest.raises(SpecError, match="V100-32GB-SXM2 offers fp32, fp16"):
        device("V100-32GB-SXM2").peak_flops("bf16")


@pytest.mark.parametrize("name, memory_gib, expected", [
    ("NVIDIA H200", 139.8, "H200-141GB-SXM"),
    ("NVIDIA H100 80GB HBM3", 79.6, "H100-80GB-SXM"),
    ("NVIDIA H100 PCIe", 79.6, "H100-80GB-PCIe"),
    ("NVIDIA A100-SXM4-40GB", 39.4, "A100-40GB-SXM"),
    ("NVIDIA GH200 480GB", 95.0, "GH200-96GB"),
    ("NVIDIA GeForce RTX 4090", 23.6, "RTX4090-24GB"),
    ("AMD Instinct MI300X", 191.5, "MI300X-192GB"),
    ("Some Accelerator 9000", 16.0, None),
])
def test_gpus_are_recognised_by_their_driver_name(name, memory_gib, expected):
    from profiler.devices import match_device

    found = match_device(name, memory_gib)
    assert (found.name if found else None) == expected
