"""The profile store: round trip, monotone interpolation, schema and device errors."""

import math
import os
from dataclasses import replace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profiler.schema import SpecError
from profiler.store import (
    INTERRUPTED_NOTE,
    PROFILE_SCHEMA_VERSION,
    MonotoneCurve,
    ProfileMeta,
    ProfileRow,
    load_profile,
    load_profiles,
    profile_text,
    save_profile,
)

META = ProfileMeta(schema_version=PROFILE_SCHEMA_VERSION, device="CPU", device_detail="test cpu",
                   dtype="fp32", torch_version="2.13.0", host="h", created="2026-01-01T00:00:00Z",
                   num_threads=1, warmup=3, repeats=15)


def _gemm(m, t, name="mlp.fc1"):
    return ProfileRow(kind="gemm", name=name, shape=(1, m, 256, 64), flops=2.0 * m * 256 * 64,
                      bytes=4.0 * (m * 64 + 64 * 256 + m * 256), time_s=t, p10_s=t * 0.9,
                      p90_s=t * 1.1, samples=15, calls=3)


def _collective(size, t, ranks=2):
    return ProfileRow(kind="collective", name="all_reduce", shape=(size,), flops=0.0,
                      bytes=float(size), ranks=ranks, time_s=t, p10_s=t, p90_s=t, samples=9,
                      calls=1)


ROWS = (_gemm(64, 1e-4), _gemm(256, 3e-4), _gemm(1024, 1.1e-3),
        ProfileRow(kind="attention", name="attn.core", variant="flash", shape=(2, 4, 64, 64, 16),
                   flops=1e6, bytes=1e5, kernels=3, time_s=5e-5, p10_s=4e-5, p90_s=6e-5,
                   samples=15, calls=20),
        _collective(1024, 2e-5), _collective(1 << 20, 1e-3))


def test_round_trip(tmp_path):
    path = str(tmp_path / "p.csv")
    save_profile(path, META, ROWS)
    profile = load_profile(path)
    assert profile.meta == META and profile.rows == ROWS
    assert load_profile(path) == profile and hash(load_profile(path)) == hash(profile)
    text = (tmp_path / "p.csv").read_text()
    assert text.startswith("## trainplan profile") and "kind,name,variant,shape" in text
    assert profile_text(profile.meta, profile.rows) == text


def test_exact_shapes_answer_with_their_median(tmp_path):
    path = str(tmp_path / "p.csv")
    save_profile(path, META, ROWS)
    p = load_profile(path)
    row = ROWS[1]
    assert p.time_s(kind="gemm", name="mlp.fc1", variant=None, shape=row.shape,
                    size=row.flops) == row.time_s
    # the variant is part of the key
    assert p.time_s(kind="attention", name="attn.core", variant="math", shape=ROWS[3].shape,
                    size=1e6) is None
    assert p.variants("attn.core") == {"flash"}


def test_interpolation_is_log_log_between_points():
    curve = MonotoneCurve([(1e3, 1e-5), (1e5, 1e-3)])
    assert curve(1e4) == pytest.approx(1e-4)  # a straight line in log-log
    assert curve(1e3) == pytest.approx(1e-5)
    # outside the measured range the profile does not answer: its reader scales the
    # analytic model by the nearest measurement (tests/planner/costs/test_compute.py)
    assert curve(5e2) is None and curve(2e5) is None
    assert curve(2 * 0.5e5) == pytest.approx(1e-3)  # the end itself, computed again
    assert curve.edge(5e2) == pytest.approx((1e3, 1e-5))
    assert curve.edge(2e5) == pytest.approx((1e5, 1e-3))


def test_an_exact_shape_is_never_predicted_faster_than_a_smaller_one(tmp_path):
    """The shipped collectives profile answered an exact 8 KB all-reduce at 1.06 ms and an
    exact 16 KB one at 0.51 ms: exact shapes skipped the monotone fit (sweep, 2026-12-03)."""
    rows = (_collective(8192, 1.06e-3), _collective(12288, 0.94e-3),
            _collective(16384, 0.51e-3), _collective(1 << 20, 2e-3))
    path = str(tmp_path / "p.csv")
    save_profile(path, META, rows)
    p = load_profile(path)
    times = [p.collective_time_s("all_reduce", r.bytes, 2) for r in rows]
    assert all(a <= b * (1 + 1e-12) for a, b in zip(times, times[1:], strict=False)), times
    assert times[-1] == 2e-3  # in order already: its own median
    # shapes of one size keep their measured order (a GEMM and its transpose)
    a, b = _gemm(256, 3e-4), replace(_gemm(256, 4e-4), shape=(1, 256, 64, 256))
    save_profile(path, META, (_gemm(64, 1e-4), a, b))
    p = load_profile(path)
    ta = p.time_s(kind="gemm", name="mlp.fc1", variant=None, shape=a.shape, size=a.flops)
    tb = p.time_s(kind="gemm", name="mlp.fc1", variant=None, shape=b.shape, size=b.flops)
    assert (ta, tb) == (3e-4, 4e-4)


def test_profiles_measuring_one_op_answer_the_same_in_either_order(tmp_path):
    """Two files with the same op and shape: the last flag's row answered exact shapes and
    the mean of both answered the others (a 700x different iteration by flag order)."""
    save_profile(str(tmp_path / "a.csv"), META, ROWS[:3])
    slow = (_gemm(64, 1e-4), _gemm(256, 1.2e-3), _gemm(1024, 1.1e-3))
    save_profile(str(tmp_path / "b.csv"), META, slow)
    args = {"devices": ["CPU"], "dtype": "fp32"}
    ab = load_profiles([str(tmp_path / "a.csv"), str(tmp_path / "b.csv")], **args).get("CPU")
    ba = load_profiles([str(tmp_path / "b.csv"), str(tmp_path / "a.csv")], **args).get("CPU")
    for m in (64, 256, 512, 1024):
        row = _gemm(m, 1.0)
        got = [p.time_s(kind="gemm", name="mlp.fc1", variant=None, shape=row.shape,
                        size=row.flops) for p in (ab, ba)]
        assert got[0] == pytest.approx(got[1], rel=1e-12), (m, got)
    both = ab.time_s(kind="gemm", name="mlp.fc1", variant=None, shape=(1, 256, 256, 64),
                     size=_gemm(256, 1.0).flops)
    assert both == pytest.approx(math.sqrt(3e-4 * 1.2e-3))  # pooled: the geometric mean


def test_save_leaves_no_fixed_temporary_name(tmp_path):
    """A folder named like the old fixed temporary file (`p.csv.tmp`) made every save there
    fail after the measurement; two writers shared that name."""
    (tmp_path / "p.csv.tmp").mkdir()
    save_profile(str(tmp_path / "p.csv"), META, ROWS)
    assert load_profile(str(tmp_path / "p.csv")).rows == ROWS
    assert sorted(os.listdir(tmp_path)) == ["p.csv", "p.csv.tmp"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.floats(1e2, 1e9), st.floats(1e-6, 1.0)), min_size=1, max_size=12),
       st.lists(st.floats(1e2, 1e9), min_size=2, max_size=8))
def test_interpolation_is_monotone_in_size(points, queries):
    """Even from noisy points that are not, a bigger op is never predicted faster."""
    curve = MonotoneCurve(points)
    answered = [(q, curve(q)) for q in sorted(queries)]
    times = [t for _, t in answered if t is not None]
    assert all(a <= b * (1 + 1e-9) for a, b in zip(times, times[1:], strict=False))
    assert all(t > 0 and math.isfinite(t) for t in times)


def test_collectives_by_group_size(tmp_path):
    path = str(tmp_path / "p.csv")
    save_profile(path, META, ROWS)
    p = load_profile(path)
    assert p.collective_time_s("all_reduce", 1024, 2) == 2e-5
    mid = p.collective_time_s("all_reduce", 32 * 1024, 2)
    assert 2e-5 < mid < 1e-3
    assert p.collective_time_s("all_reduce", 1024, 4) is None
    assert p.collective_time_s("all_gather", 1024, 2) is None


def _write(tmp_path, text, name="p.csv"):
    path = tmp_path / name
    path.write_text(text)
    return str(path)


@pytest.mark.parametrize("edit, needle", [
    (lambda t: t.replace("schema_version: 1", "schema_version: 2"),
     "p.csv:schema_version: 2 is not allowed (this trainplan reads profile schema version 1"),
    (lambda t: t.replace("# schema_version: 1\n", ""),
     "p.csv:schema_version: null is not allowed"),
    (lambda t: t.replace("device: CPU", "device: Z100"),
     "p.csv:device: 'Z100' is not a known GPU type"),
    (lambda t: t.replace("num_threads: 1", "num_threads: 0"),
     "p.csv:num_threads: 0 is not allowed (must be ≥ 1)"),
    (lambda t: t.replace("# repeats: 15\n", "# repeats: 15\n# colour: red\n"),
     "p.csv:colour: 'red' is not allowed (unknown field"),
    (lambda t: t.replace("kind,name", "kind,label"), "p.csv: header:"),
    (lambda t: t.replace("gemm,mlp.fc1,,1x64x256x64", "gemm,mlp.fc1,,1xAx256x64", 1),
     "p.csv:row 1 (line 14):shape: '1xAx256x64' is not allowed (expected integers joined by x)"),
    (lambda t: t.replace("gemm,mlp.fc1", "matmul,mlp.fc1", 1),
     "p.csv:row 1 (line 14):kind: 'matmul' is not allowed (allowed: gemm, attention"),
    # issue 15: NaN times priced a plan at NaN; one NaN row was skipped without a word
    (lambda t: t.replace(",0.0001,", ",nan,", 1),
     "p.csv:row 1 (line 14):time_s: nan is not allowed (expected a finite number)"),
    (lambda t: t.replace(",0.0011,", ",inf,", 1),
     "p.csv:row 3 (line 16):time_s: inf is not allowed (expected a finite number)"),
    (lambda t: t.replace(",0.0001,", ",1e300,", 1), "p.csv:row 1 (line 14):time_s: 1e+300 is not allowed"),
    (lambda t: t.replace("1x64x256x64", "1x" + "9" * 30 + "x256x64", 1),
     "p.csv:row 1 (line 14):shape[1]: 999999999999999999999999999999 is not allowed "
     "(must be ≤ 1,099,511,627,776)"),
    # a GEMM of two numbers, percentiles out of order, a shape measured twice: each was
    # taken (the second of two rows answered exact lookups, the first did not)
    (lambda t: t.replace("1x64x256x64", "64x256", 1),
     "p.csv:row 1 (line 14):shape: '64x256' is not allowed (a gemm row's shape has 4 numbers"),
    (lambda t: t.replace(",0.0003,0.00027,0.00033,", ",0.0003,0.00033,0.00027,", 1),
     "p.csv:row 2 (line 15):time_s: 'p10 0.00033 s, median 0.0003 s, p90 0.00027 s' is not allowed "
     "(p10_s <= time_s <= p90_s)"),
    (lambda t: t + t.splitlines()[-1].replace(",0.001,0.001,0.001,", ",0.002,0.002,0.002,")
     + "\n",
     "p.csv:row 7 (line 20): 'collective all_reduce 1048576 in 0.002 s' is not allowed (one "
     "measurement of an op and shape a file; row 6 (line 19) measures it in 0.001 s)"),
    # a call faster than any launch or dispatch: a unit slip (1e-300 s printed 300 digits)
    (lambda t: t.replace(",0.0001,", ",1e-300,", 1),
     "p.csv:row 1 (line 14):time_s: '1e-300 s' is not allowed (at least 1e-07 s"),
    # the count a short row has
    (lambda t: t.replace(",1x64x256x64,", ",", 1), "p.csv:row 1 (line 14): "),
    # a cell past the csv module's limit raised _csv.Error with a traceback
    (lambda t: t.replace("gemm,mlp.fc1,", "gemm," + "x" * 200_000 + ",", 1),
     "p.csv:row 1: 'unreadable CSV (field larger than field limit (131072))' is not allowed "
     "(cells of at most 131,072 characters)"),
    # a header and no rows priced nothing, while the sources still named the file
    (lambda t: t[:t.index("\n", t.index("kind,name")) + 1],
     "p.csv: 'a header and no rows' is not allowed (a profile with measured rows"),
])
def test_bad_files_get_one_line_errors(tmp_path, edit, needle):
    text = profile_text(META, ROWS)
    with pytest.raises(SpecError) as err:
        load_profile(_write(tmp_path, edit(text)))
    assert needle in str(err.value), str(err.value)
    assert "\n" not in str(err.value)


def test_a_profile_of_another_device_or_dtype_is_refused(tmp_path):
    path = _write(tmp_path, profile_text(META, ROWS))
    with pytest.raises(SpecError, match=r"--profile .*p.csv: device: 'CPU' is not allowed "
                       r"\(the plan's GPUs are A100-80GB-SXM\)"):
        load_profiles([path], devices=["A100-80GB-SXM"], dtype="fp32")
    with pytest.raises(SpecError, match="dtype: 'fp32' is not allowed"):
        load_profiles([path], devices=["CPU"], dtype="bf16")
    assert load_profiles([path], devices=["CPU"], dtype="fp32").get("CPU") is not None


def test_a_folder_picks_the_profiles_of_the_plans_devices(tmp_path):
    folder = tmp_path / "profiles"
    folder.mkdir()
    save_profile(str(folder / "cpu.csv"), META, ROWS[:4])
    save_profile(str(folder / "cpu-collectives.csv"), META, ROWS[4:])
    other = ProfileMeta(**{**META.__dict__, "device": "H100-80GB-SXM", "dtype": "bf16"})
    save_profile(str(folder / "h100.csv"), other, ROWS[:4])
    profiles = load_profiles([str(folder)], devices=["CPU"], dtype="fp32")
    assert [name for name, _ in profiles.by_device] == ["CPU"]
    merged = profiles.get("CPU")
    assert merged is not None and len(merged.rows) == len(ROWS)
    assert merged.collective_time_s("all_reduce", 1024, 2) == 2e-5
    # a folder with nothing for the plan would leave --profile doing nothing: said, exit 2
    with pytest.raises(SpecError, match=r"a profile of V100-32GB-SXM2 in fp32; it holds "
                                        r"CPU fp32, H100-80GB-SXM bf16"):
        load_profiles([str(folder)], devices=["V100-32GB-SXM2"], dtype="fp32")


def test_the_example_profiles_load():
    """profiles/ ships examples measured on the project's CPU machine (docs/profiles.md)."""
    import glob

    paths = sorted(glob.glob("profiles/*.csv"))
    assert paths
    for path in paths:
        profile = load_profile(path)
        assert profile.meta.device == "CPU" and profile.rows
    merged = load_profiles(["profiles"], devices=["CPU"], dtype="fp32").get("CPU")
    assert merged is not None and merged.op_rows and merged.collective_rows
    # the files that hold collectives, as sources name them (`plan run`'s report called
    # the op profile a "measured collective profile" too)
    with_collectives = [p for p in paths if load_profile(p).collective_rows]
    assert merged.collective_path.split(" + ") == with_collectives != paths


def test_fp8_and_tf32_profiles_answer_plans_of_their_dtype(tmp_path):
    """Profiles are per dtype: a folder's tf32 and fp8 files answer plans in that dtype,
    and say how the dtype ran (`precision`); files written before that field read as null."""
    folder = tmp_path / "profiles"
    folder.mkdir()
    h200 = {**META.__dict__, "device": "H200-141GB-SXM", "cuda_version": "13.0"}
    for dtype, precision in (("bf16", None), ("tf32", "fp32 storage, matmuls on TF32"),
                             ("fp8", "FP8 GEMMs for attn.qkv")):
        meta = ProfileMeta(**{**h200, "dtype": dtype, "precision": precision})
        save_profile(str(folder / f"h200-{dtype}.csv"), meta, ROWS[:4])
        assert load_profile(str(folder / f"h200-{dtype}.csv")).meta == meta
    for dtype in ("bf16", "tf32", "fp8"):
        chosen = load_profiles([str(folder)], devices=["H200-141GB-SXM"], dtype=dtype)
        profile = chosen.get("H200-141GB-SXM")
        assert profile is not None and profile.meta.dtype == dtype
    old = (tmp_path / "old.csv")
    old.write_text(profile_text(META, ROWS).replace("precision: null\n", ""))
    assert "precision" not in old.read_text() and load_profile(str(old)).meta == META


def test_a_row_repeated_at_the_same_time_prices_alike_and_loads(tmp_path):
    """The same op, shape and time twice (another sample count) was refused as measured
    "at another time"; the lookup takes the same time either way."""
    again = ROWS + (replace(ROWS[-1], samples=ROWS[-1].samples + 4),)
    profile = load_profile(_write(tmp_path, profile_text(META, again)))
    assert profile.collective_time_s("all_reduce", 1 << 20, 2) == pytest.approx(ROWS[-1].time_s)


def test_hand_edits_that_hold_the_same_table_still_load(tmp_path):
    """A blank line (refused as `row 41: []`) and a spreadsheet's byte-order mark (refused
    as a bad header) change nothing in the table."""
    path = str(tmp_path / "p.csv")
    save_profile(path, META, ROWS)
    text = (tmp_path / "p.csv").read_text()
    edited = "\ufeff" + text.replace("\nkind,", "\n\nkind,") + "\n\n"
    assert load_profile(_write(tmp_path, edited, "q.csv")).rows == ROWS


@pytest.mark.parametrize("text, needle", [
    ("name: two-dc\nnode_groups: []\n", "q.csv: 'name: two-dc' is not allowed (a trainplan "
                                        "profile"),
    ("", "q.csv: 'an empty file' is not allowed (a trainplan profile"),
])
def test_a_file_that_is_not_a_profile_says_so(tmp_path, text, needle):
    """A cluster file given to --profile was told to re-measure its schema version."""
    with pytest.raises(SpecError) as err:
        load_profile(_write(tmp_path, text, "q.csv"))
    assert needle in str(err.value)


def test_a_newer_profile_asks_for_a_newer_trainplan(tmp_path):
    path = str(tmp_path / "p.csv")
    save_profile(path, META, ROWS)
    text = (tmp_path / "p.csv").read_text().replace("schema_version: 1", "schema_version: 2")
    with pytest.raises(SpecError, match="written by a newer trainplan: update this one"):
        load_profile(_write(tmp_path, text, "q.csv"))


def test_a_gpu_row_faster_than_the_gpus_peak_is_refused(tmp_path):
    """A GEMM at 1e-12 s (a hand edit) loaded and priced the plan with it; a GPU's rows
    are held to 1.1x the datasheet peak of the precision they ran in. The bound was 1.5x
    the fastest peak of any precision: an H100 bf16 profile could claim 2,968 TFLOP/s, 3x
    its bf16 peak, and price a plan at 179% MFU (profile sweep, 2026-12-04). The CPU's
    peak is a template's: not held."""
    gpu = replace(META, device="A100-80GB-SXM", dtype="bf16", cuda_version="12.4")
    fine = _gemm(1024, 1e-4)  # 0.3 TFLOP/s
    save_profile(str(tmp_path / "ok.csv"), gpu, (fine,))
    load_profiles([str(tmp_path / "ok.csv")], devices=["A100-80GB-SXM"], dtype="bf16")
    # 374 TFLOP/s: under 1.5 x the A100's fastest peak (312), over 1.1 x its bf16 peak
    big = _gemm(65536, 1.0)
    t = big.flops / (1.2 * 312e12)
    save_profile(str(tmp_path / "bad.csv"), gpu, (replace(big, time_s=t, p10_s=t, p90_s=t),))
    with pytest.raises(SpecError, match=r"gemm mlp.fc1 1x65536x256x64 at 374 TFLOP/s' is not "
                                        r"allowed \(at most 1.1 x A100-80GB-SXM's bf16 "
                                        r"datasheet peak \(312 TFLOP/s\)"):
        load_profiles([str(tmp_path / "bad.csv")], devices=["A100-80GB-SXM"], dtype="bf16")
    fast = replace(fine, time_s=1e-7, p10_s=1e-7, p90_s=1e-7)  # 335 TFLOP/s
    # the sweep's H100 bf16 GEMMs at 1.44 x the bf16 peak: under 1.5 x its FP8 peak
    t = big.flops / (1.44 * 989.4e12)
    save_profile(str(tmp_path / "h100.csv"), replace(gpu, device="H100-80GB-SXM"),
                 (replace(big, time_s=t, p10_s=t, p90_s=t),))
    with pytest.raises(SpecError, match=r"at most 1.1 x H100-80GB-SXM's bf16 datasheet peak "
                                        r"\(989 TFLOP/s\)"):
        load_profiles([str(tmp_path / "h100.csv")], devices=["H100-80GB-SXM"], dtype="bf16")
    save_profile(str(tmp_path / "cpu.csv"), META, (fast,))  # a CPU's: no template to hold
    load_profiles([str(tmp_path / "cpu.csv")], devices=["CPU"], dtype="fp32")


def test_a_profile_measured_on_another_kind_of_device_is_refused(tmp_path):
    """A CPU measurement whose `device:` line was edited to a GPU priced an H100 plan at
    234 s an iteration (1.6% MFU) and named it as measured. `plan profile` writes the CUDA
    runtime of every GPU measurement and null on the CPU: the two must agree."""
    rows = (_gemm(1024, 1e-4),)
    save_profile(str(tmp_path / "gpu.csv"), replace(META, device="H100-80GB-SXM", dtype="bf16"),
                 rows)
    with pytest.raises(SpecError, match=r"device: 'H100-80GB-SXM' is not allowed \(a profile "
                                        r"measured on that GPU; this one has no CUDA runtime"):
        load_profiles([str(tmp_path / "gpu.csv")], devices=["H100-80GB-SXM"], dtype="bf16")
    save_profile(str(tmp_path / "cpu.csv"), replace(META, cuda_version="12.4"), rows)
    with pytest.raises(SpecError, match=r"device: 'CPU' is not allowed \(a profile measured on "
                                        r"the CPU; this one ran on a GPU"):
        load_profiles([str(tmp_path / "cpu.csv")], devices=["CPU"], dtype="fp32")


def test_a_cpu_profile_measured_with_several_threads_is_refused_for_cpu_ranks(tmp_path):
    """CPU ranks run one thread each (executor/runtime.py); a 16-thread profile priced
    them with no word (its `num_threads` was read nowhere). Named: refused; in a folder:
    skipped, and said so when nothing else fits."""
    save_profile(str(tmp_path / "t16.csv"), replace(META, num_threads=16), ROWS)
    with pytest.raises(SpecError, match=r"num_threads: 16 is not allowed \(1: CPU ranks run "
                                        r"one thread each"):
        load_profiles([str(tmp_path / "t16.csv")], devices=["CPU"], dtype="fp32")
    with pytest.raises(SpecError, match=r"it holds CPU fp32 with 16 threads"):
        load_profiles([str(tmp_path)], devices=["CPU"], dtype="fp32")


def test_a_file_reached_twice_counts_once_and_disagreeing_files_are_noted(tmp_path):
    """A file named and again in its named folder was loaded twice (the sources named it
    twice); two files of one device whose rows disagree 10x were pooled without a word
    (the plan priced at their geometric mean)."""
    folder = tmp_path / "f"
    folder.mkdir()
    save_profile(str(folder / "a.csv"), META, ROWS)
    twice = load_profiles([str(folder / "a.csv"), str(folder)], devices=["CPU"], dtype="fp32")
    assert twice.paths == (str(folder / "a.csv"),) and twice.notes == ()
    slow = tuple(replace(r, time_s=r.time_s * 10, p10_s=r.p10_s * 10, p90_s=r.p90_s * 10)
                 for r in ROWS)
    save_profile(str(folder / "b.csv"), META, slow)
    both = load_profiles([str(folder)], devices=["CPU"], dtype="fp32")
    assert len(both.notes) == 1 and "differ by more than 1.5x (up to 10x)" in both.notes[0]
    near = tuple(replace(r, time_s=r.time_s * 1.2, p10_s=r.p10_s * 1.2, p90_s=r.p90_s * 1.2)
                 for r in ROWS)
    save_profile(str(folder / "b.csv"), META, near)  # a host's own drift: no note
    assert load_profiles([str(folder)], devices=["CPU"], dtype="fp32").notes == ()


def test_an_interrupted_profile_is_noted_where_it_prices_a_plan(tmp_path):
    """`plan profile show` flagged an interrupted profile, but simulate, search and run
    used it without a word."""
    save_profile(str(tmp_path / "i.csv"), replace(META, command=f"plan profile{INTERRUPTED_NOTE}"
                                                  f"{len(ROWS)} rows"), ROWS)
    notes = load_profiles([str(tmp_path / "i.csv")], devices=["CPU"], dtype="fp32").notes
    assert notes == (f"{tmp_path / 'i.csv'} is an interrupted profile: it holds the 6 rows "
                     "measured before it was stopped; what it lacks is priced by the analytic "
                     "model",)
