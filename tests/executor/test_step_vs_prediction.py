"""A profile-driven prediction of a training step against the step measured in torch.

One CPU process (tp = pp = dp = 1), the same model, shapes, dtype (fp32), thread count
(1) and kernels: `plan profile` measures the ops, `plan simulate --profile` predicts the
step, executor/train.py times it. The bound is 20% (the issue's test bound). The machine
may be shared, so one attempt that loses to a burst of load is retried, up to three in
all: the bound is not loosened.

On 2026-12-07 this VM ran the same ops 1.7-4x slower than on 2026-11-30 (step 19-25 ms
against 9) and the prediction from ops timed back to back fell to -12..-28% (CI: -20,
-22, -24%, a failed landing); the CPU now times a step's ops in turn, as the step runs
them (docs/profiles.md, "How ops are measured"), and the prediction is -11..+14% over six
trials that day (mean +3.5%).
"""

import json

import pytest

torch = pytest.importorskip("torch")

from executor.train import time_train_step  # noqa: E402
from planner.cli import main  # noqa: E402
from planner.specs.model import preset  # noqa: E402

MODEL, MBS, SEQ = "debug-tiny", 8, 64
ATTEMPTS = 3


def _profile(path, capsys):
    code = main(["profile", "--device", "cpu", "--model", MODEL, "--mbs", str(MBS), "--seq",
                 str(SEQ), "--dtype", "fp32", "--threads", "1", "-o", str(path)])
    capsys.readouterr()
    assert code == 0


def _predict(path, capsys):
    code = main(["simulate", "--model", MODEL, "--gpus", "CPU:1", "--tp", "1", "--pp", "1",
                 "--dp", "1", "--mbs", str(MBS), "--gbs", str(MBS), "--seq", str(SEQ),
                 "--dtype", "fp32", "--profile", str(path), "--json"])
    out, _ = capsys.readouterr()
    assert code == 0
    return json.loads(out)


@pytest.mark.serial  # times what it runs
def test_predicted_step_matches_the_measured_step(tmp_path, capsys):
    errors = []
    for attempt in range(ATTEMPTS):
        path = tmp_path / f"cpu-{attempt}.csv"
        _profile(path, capsys)  # its wall time: benchmarks/profile_vs_step.py
        result = _predict(path, capsys)
        assert result["sources"]["compute"].startswith(f"measured profile {path}")
        kernels = result["kernels"]
        measured = time_train_step(preset(MODEL), batch_size=MBS, seq_len=SEQ, dtype="fp32",
                                   attention=kernels["attention"],
                                   optimizer=kernels["optimizer"], threads=1, repeats=21)
        error = result["iteration_time_s"] / measured.timing.median_s - 1
        errors.append(round(error, 3))
        if abs(error) < 0.20:
            break
    assert abs(errors[-1]) < 0.20, f"predicted / measured - 1 per attempt: {errors}"
