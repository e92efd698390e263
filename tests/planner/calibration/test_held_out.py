"""The held-out report's settings (planner/calibration/held_out.py)."""

import pytest

from planner.calibration.fit import HOPPER_CALIBRATION, hopper_calibration_cases
from planner.calibration.held_out import parse_setting
from planner.calibration.published import dgxc_cases


def test_a_setting_names_an_architecture_field_and_value():
    param, value = parse_setting("hopper.gemm_efficiency=0.594")
    assert (param.target, param.field, value) == ("arch:hopper", "gemm_efficiency", 0.594)
    for bad in ("hopper=0.5", "hopper.gemm_efficiency", ".gemm_efficiency=0.5"):
        with pytest.raises(ValueError, match="ARCH.FIELD=VALUE"):
            parse_setting(bad)


def test_hoppers_calibration_split_is_the_launcher_h100_bf16_rows():
    """65 NeMo-launcher H100 BF16 rows fit; NeMo 2.0, FP8 and GB200 rows stay held out."""
    assert HOPPER_CALIBRATION == {"gpu": "H100-80GB-SXM", "dtype": "bf16",
                                  "framework": "NeMo launcher"}
    chosen = hopper_calibration_cases()
    assert len(chosen) == 65 and len(dgxc_cases()) == 212
    plans = [c.plans[0] for c in chosen]
    assert all(p.training.dtype == "bf16" for p in plans)
    assert all(p.cluster.node_groups[0].gpu == "H100-80GB-SXM" for p in plans)
    assert not any(c.id.endswith(("nemo2502", "1f6d9f4")) for c in chosen)
