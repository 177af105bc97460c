"""benchmarks/gpu_check.py on a machine without CUDA: the skip line and exit 0 (what CI runs), the
pure helpers (table, budget, JSON), and a CPU dry run of the device-agnostic checks' own code."""

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu_check.py"

spec = importlib.util.spec_from_file_location("gpu_check", SCRIPT)
gck = importlib.util.module_from_spec(spec)
sys.modules["gpu_check"] = gck  # dataclasses resolve annotations through sys.modules
spec.loader.exec_module(gck)

no_accelerator = pytest.mark.skipif(
    torch.cuda.is_available() or torch.backends.mps.is_available(), reason="this machine has an accelerator"
)


def _env(**extra):
    env = {k: v for k, v in os.environ.items() if k not in ("OUT", "GPU_CHECK_DEVICE", "GPU_CHECK_BUDGET_S")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return {**env, **extra}


@no_accelerator
def test_script_without_cuda_skips_every_check_and_exits_0(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT)], capture_output=True, text=True, timeout=120,
                         env=_env(OUT=str(tmp_path)), cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert f"no CUDA device: {len(gck.CHECKS)} checks skipped" in out.stdout
    doc = json.loads((tmp_path / "gpu_check.json").read_text())
    assert [r["check"] for r in doc["rows"]] == [c.name for c in gck.CHECKS]
    assert {r["result"] for r in doc["rows"]} == {gck.SKIP_NO_CUDA}
    assert doc["counts"] == {"pass": 0, "fail": 0, "skipped": len(gck.CHECKS)}
    assert doc["summary"].startswith("gpu_check: 0 pass, 0 fail") and doc["summary"] in out.stdout


def test_table_has_the_four_columns_and_escapes_pipes():
    rows = [gck.Row("a | b", "x", "1.0x", gck.PASS), gck.Row("longer check name", "y\nz", "-", gck.SKIP_TIME)]
    lines = gck.format_table(rows).splitlines()
    assert len(lines) == 4
    assert [c.strip() for c in lines[0].strip("|").split("|")] == ["check", "expected", "measured", "pass/fail"]
    assert set(lines[1]) <= {"|", "-", " "}
    assert all(line.count("|") == 5 for line in lines)  # a "|" in a cell would break the Markdown table
    assert "a / b" in lines[2] and "y z" in lines[3]
    assert len({len(line) for line in lines}) == 1  # columns aligned


def test_counts_and_summary_line():
    rows = [gck.Row("a", "", result=gck.PASS), gck.Row("b", "", result=gck.FAIL),
            gck.Row("c", "", result=gck.SKIP_TIME), gck.Row("d", "", result="skipped: needs 2 GPUs (1 here)")]
    assert gck.count(rows) == {"pass": 1, "fail": 1, "skipped": 2}
    assert gck.summary_line(rows, "GPU X", 12.4) == "gpu_check: 1 pass, 1 fail, 2 skipped on GPU X in 12 s"


def test_budget_allows_a_check_only_if_its_estimate_fits():
    now = [100.0]
    b = gck.Budget(60, clock=lambda: now[0])
    assert b.allows(60) and not b.allows(60.1)
    now[0] = 130.0
    assert b.elapsed() == 30 and b.left() == 30
    assert b.allows(30) and not b.allows(31)
    now[0] = 170.0
    assert b.left() == -10 and not b.allows(0)
    with pytest.raises(ValueError, match="GPU_CHECK_BUDGET_S"):
        gck.Budget(0)


def test_budget_from_env():
    assert gck.budget_from_env({}) == gck.BUDGET_S == 300
    assert gck.budget_from_env({"GPU_CHECK_BUDGET_S": "42.5"}) == 42.5
    for bad in ("five", "-1", "0"):
        with pytest.raises(ValueError, match="GPU_CHECK_BUDGET_S"):
            gck.budget_from_env({"GPU_CHECK_BUDGET_S": bad})


def test_write_json_only_with_an_out_dir(tmp_path):
    rows = [gck.Row("a", "e", "m", gck.PASS, 1.5, {"traceback": "x"})]
    assert gck.write_json(rows, {"summary": "s"}, None) is None
    assert gck.write_json(rows, {"summary": "s"}, "") is None
    path = gck.write_json(rows, {"summary": "s"}, tmp_path / "new")
    assert path == tmp_path / "new" / "gpu_check.json"
    doc = json.loads(path.read_text())
    assert doc["summary"] == "s"
    assert doc["rows"] == [{"check": "a", "expected": "e", "measured": "m", "result": "pass", "seconds": 1.5,
                            "detail": {"traceback": "x"}}]


def test_losses_match_and_the_overwritten_loss_symptom():
    assert gck.losses_match([1.0, 2.0], [1.0005, 2.0], rtol=1e-3) == (True, pytest.approx(0.0005 / 1.0005))
    assert not gck.losses_match([1.0, 2.1], [1.0, 2.0], rtol=1e-3)[0]
    assert not gck.losses_match([1.0], [1.0, 2.0], rtol=1)[0]  # a missing step never matches
    assert not gck.losses_match([float("nan")], [1.0], rtol=1)[0]
    assert not gck.losses_match([], [], rtol=1)[0]
    # what a CUDA-graph replay that overwrote the kept losses looks like: every step reads the last
    overwritten = [1.7] * 10
    assert gck.all_identical(overwritten)
    assert not gck.losses_match(overwritten, [2.3 - 0.06 * i for i in range(10)], rtol=1e-3)[0]
    assert not gck.all_identical([2.3, 2.2]) and not gck.all_identical([2.3])


def test_pick_device_dry_run_and_bad_value():
    assert gck.pick_device({"GPU_CHECK_DEVICE": "cpu"}) == "cpu"
    with pytest.raises(ValueError, match="only value is 'cpu'"):
        gck.pick_device({"GPU_CHECK_DEVICE": "cuda"})


def test_every_check_is_described_and_budgeted():
    names = [c.name for c in gck.CHECKS]
    assert len(names) == len(set(names))
    assert all(c.expected and c.estimate_s > 0 and set(c.devices) <= {"cuda", "mps", "cpu"} for c in gck.CHECKS)
    assert gck.CHECKS[-1].run is gck.check_oom  # last: an OOM must not spoil the checks after it
    assert all("cpu" not in c.devices for c in gck.CHECKS if c.run in (gck.check_oom, gck.check_tf32))


def test_a_check_that_raises_is_a_failed_row_not_a_crash(tmp_path):
    def boom(ctx):
        raise RuntimeError("CUDA error: an illegal memory access\nmore")

    def skip(ctx):
        raise gck.Skip("skipped: needs 2 GPUs (1 here)")

    ctx = gck.Context("cpu", tmp_path)
    row = gck.run_one(gck.Check("boom", "ok", boom, 1), ctx)
    assert row.result == gck.FAIL and row.measured == "RuntimeError: CUDA error: an illegal memory access"
    assert "Traceback" in row.detail["traceback"]
    assert gck.run_one(gck.Check("skip", "ok", skip, 1), ctx).result == "skipped: needs 2 GPUs (1 here)"


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:amp='fp16' on CPU")
def test_cpu_dry_run_of_the_device_agnostic_checks(tmp_path):
    # Runs the checks' own code (trials, loss comparisons, the fp16 overflow skip) at small sizes, so a
    # typo is found here and not on a lent GPU. Compile checks are left out: a cold compile costs ~80 s.
    ctx = gck.Context("cpu", tmp_path)
    for check in (gck.check_step_clock, gck.check_peak_memory, gck.check_fp16_scaler, gck.check_pinned_workers,
                  gck.check_bf16_channels_last):
        row = gck.run_one(gck.Check(check.__name__, "", check, 1), ctx)
        assert row.result == gck.PASS, (row.measured, row.detail.get("traceback"))


@pytest.mark.slow
def test_cpu_dry_run_of_the_fsdp2_check_under_torchrun(tmp_path):
    # The NCCL FSDP2 check's own code (2 of its 3 torchrun jobs, through the CLI) on gloo at a small size.
    row = gck.run_one(gck.Check("fsdp2", "", gck.check_fsdp2, 1), gck.Context("cpu", tmp_path))
    assert row.result == gck.PASS, (row.measured, row.detail.get("traceback"))
    assert "model state 0.5" in row.measured and "losses within" in row.measured


def _tf32(x: torch.Tensor) -> torch.Tensor:
    """x rounded toward zero to TF32's 10-bit mantissa (the 13 low bits of fp32's 23 cleared)."""
    return (x.view(torch.int32) & ~0x1FFF).view(torch.float32)


def test_the_tf32_bound_holds_for_emulated_tf32_rounding():
    # The evidence behind TF32_FORWARD_RTOL: inputs rounded to 10 mantissa bits, products summed in
    # fp32, as the tensor cores do; three layers of the check's MLP (narrower, for the CPU).
    g = torch.Generator().manual_seed(0)
    x = torch.randn(256, 1024, generator=g)
    ws = [torch.randn(1024, 1024, generator=g) / 32 for _ in range(3)]

    def forward(cast):
        h = x
        for i, w in enumerate(ws):
            h = cast(h) @ cast(w)
            h = torch.relu(h) if i < 2 else h
        return h

    ref = forward(lambda t: t.double())
    err_tf32 = gck.relative_error(forward(_tf32), ref)
    err_fp32 = gck.relative_error(forward(lambda t: t), ref)
    assert 1e-4 < err_tf32 < gck.TF32_FORWARD_RTOL / 3  # ~1e-3: a small multiple of 2**-11
    assert err_tf32 >= gck.TF32_ENGAGED * err_fp32
    assert gck.tf32_expectation(err_tf32, err_fp32, 2.76, True, True)  # the run: 2.76x
    assert not gck.tf32_expectation(err_fp32, err_fp32, 2.76, True, True)  # same error as fp32: TF32 not used
    assert not gck.tf32_expectation(0.05, err_fp32, 2.76, True, True)  # beyond what 10 mantissa bits explain
    assert not gck.tf32_expectation(err_tf32, err_fp32, 1.05, True, True)
    assert not gck.tf32_expectation(err_tf32, err_fp32, 2.76, True, False)  # the precision setting leaked


def test_stages_sum_to_the_step_within_the_bounds():
    stages = {"data": 1.0, "forward": 30.0, "backward": 55.0, "optimizer": 8.0}
    assert gck.stages_sum_ok(stages, 100.0) == (True, pytest.approx(0.94))
    assert not gck.stages_sum_ok(stages, 200.0)[0]  # half the step unaccounted for: host time, not device
    assert not gck.stages_sum_ok({**stages, "forward": 60.0}, 100.0)[0]  # past the step: counted twice
    assert not gck.stages_sum_ok(stages, 0.0)[0]


@pytest.mark.slow
def test_cpu_dry_run_of_the_lm_data_wait_and_stage_checks(tmp_path, monkeypatch):
    # The LM checks' own code (a trial with the default loader, diagnose, the profiled stages against the
    # traced step) at a small size; on a GPU the same code runs the 8-layer, d=768 decoder.
    # The LM row's verdict is the GPU's to give (a loaded 2-core CPU may be told "cpu-threads"): here it
    # must run and report its figures; the stages must sum to the step on the CPU too (host ranges).
    from workbench.diagnose import report

    monkeypatch.setattr(report, "CONFIRM_ROUNDS", 1)  # a noisy CPU may ask for rounds: one shows they run
    monkeypatch.setattr(report, "LOADER_S", 2.0)
    ctx = gck.Context("cpu", tmp_path)
    lm = gck.run_one(gck.Check("lm", "", gck.check_lm_data_wait, 1), ctx)
    assert "traceback" not in lm.detail, lm.detail["traceback"]
    assert lm.measured.startswith("data wait ") and "diagnose: " in lm.measured and 0 <= lm.detail["data_wait_share"] <= 1
    stages = gck.run_one(gck.Check("stages", "", gck.check_device_stages, 1), ctx)
    assert stages.result == gck.PASS, (stages.measured, stages.detail.get("traceback"))


@pytest.mark.slow
def test_cpu_dry_run_of_the_shape_and_demo_size_checks(tmp_path):
    """The code of the variable-length bf16 check and the demos-at-the-device's-size check, at CPU sizes
    (what they verify about a GPU needs one)."""
    ctx = gck.Context("cpu", tmp_path)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # a shared 2-core machine: one intra-op thread (behaviour, not speed)
    try:
        rows = [gck.run_one(gck.Check(check.__name__, "", check, 1), ctx)
                for check in (gck.check_shapes_bf16, gck.check_demo_lessons)]
    finally:
        torch.set_num_threads(threads)
    for row in rows:
        assert row.result == gck.PASS, (row.measured, row.detail.get("traceback"))
    assert "shapes x" in rows[0].measured and "sizes tiny/tiny picked: True" in rows[1].measured


@pytest.mark.worker
def test_cpu_dry_run_of_the_worker_process_check(tmp_path):
    """The check a lent GPU runs on the default place of trials, at CPU sizes: it runs and names the worker.
    (Its 0.85-1.15 bound is the GPU's; on a loaded CPU the row may read fail on the ratio alone.)"""
    row = gck.run_one(gck.Check("worker", "", gck.check_worker_process, 1), gck.Context("cpu", tmp_path))
    assert "ran_in ['worker'] on cpu" in row.measured and "ready in" in row.measured, (row.measured, row.detail)


def test_the_gpu_idle_a_loader_should_read():
    lo, hi = gck.idle_expected(0.30, 0.10)  # a loader 3 steps long: ~2 steps of GPU idle
    assert lo == pytest.approx(0.16) and hi == pytest.approx(0.25)
    assert gck.idle_expected(0.03, 0.10) == (0.0, pytest.approx(0.05))  # hidden under the step: no idle
    assert not lo <= 0.30 <= hi  # the host-time figure (the whole loader) is outside


@pytest.mark.slow
def test_cpu_dry_run_of_the_gpu_idle_check(tmp_path):
    # The check's own code (a cached trial, then the same bench with a hidden and a slow loader) at a CPU
    # size; on the CPU the host is the device, so only the clock it names is checked here.
    row = gck.run_one(gck.Check("idle", "", gck.check_gpu_idle_wait, 1), gck.Context("cpu", tmp_path))
    assert row.result == gck.PASS, (row.measured, row.detail.get("traceback"))
    assert "clock: host" in row.measured and "host wait" in row.measured
    assert row.detail["slow_share"] > row.detail["hidden_share"]  # a slower loader waits longer on the CPU
