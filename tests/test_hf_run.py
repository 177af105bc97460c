"""wb.TrainerCallback counts train() as it trains (faces/hf_run.py): evaluation and checkpoint saves stay out
of the measured window with their seconds in the notes; a step's samples are the Trainer's train batch size
(DataParallel's GPUs included) x accumulation, summed over ranks under DDP into one row on rank zero."""

from __future__ import annotations

import re
import statistics
import subprocess
import sys
import textwrap
import time
import warnings

import pytest
from conftest import ROOT

import workbench as wb

transformers = pytest.importorskip("transformers")
pytest.importorskip("accelerate")
from test_hf import texts, tiny_gpt2, trainer_of  # noqa: E402

EVAL_STEPS = 6  # each evaluation batch lasts this many recent training steps (2 batches: 12 steps' time)


class SlowEvaluation(transformers.TrainerCallback):
    """Each evaluation batch sleeps as long as EVAL_STEPS recent training steps (they stretch together on a
    loaded machine): an evaluation every 10 steps outlasts the training."""

    def __init__(self) -> None:
        self.intervals: list[float] = []
        self.slept = 0.0
        self._t: float | None = None

    def on_step_end(self, args, state, control, **kwargs):
        now = time.perf_counter()
        if self._t is not None:
            self.intervals.append(now - self._t)
        self._t = now

    def on_prediction_step(self, args, state, control, **kwargs):
        s = EVAL_STEPS * statistics.median(self.intervals[-20:])
        time.sleep(s)
        self.slept += s

    def on_evaluate(self, args, state, control, **kwargs):
        self._t = None  # the next interval is not a training step's


def bench_of(tmp_path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return wb.Workbench.from_trainer(trainer_of(), log=tmp_path / "runs", steps=3, warmup_steps=1)


def train(bench, tmp_path, *, evaluate: bool, steps: int = 40):
    """(the row, the slow-evaluation callback) of train() with, or without, an evaluation every 10 steps."""
    slow, callback = SlowEvaluation(), wb.TrainerCallback(bench)
    real = trainer_of(max_steps=steps, output_dir=str(tmp_path / "out"), per_device_train_batch_size=4)
    if evaluate:  # the Trainer refuses eval_strategy="steps" without an eval_dataset at construction
        real.eval_dataset = texts(32, seed=3)
        real.args.eval_strategy, real.args.eval_steps = transformers.IntervalStrategy.STEPS, 10
        real.args.per_device_eval_batch_size = 16
    real.add_callback(slow)
    real.add_callback(callback)
    real.train()
    assert callback.result is not None and callback.result.ok, callback.result
    return callback.result, slow


@pytest.mark.slow
def test_evaluation_during_train_is_left_out_of_the_window_and_said_with_its_seconds(tmp_path):
    """The steps evaluation fell in are not in the window (as the Lightning test checks by speed, here by
    count: a tiny GPT-2's steps on a shared CPU vary too much for a speed ratio), and the notes say how long."""
    bench = bench_of(tmp_path)
    evaluated, slow = train(bench, tmp_path, evaluate=True)
    assert slow.slept > 0
    warm = evaluated.extra["warmup_rule"]["steps"]
    held = [i for i in range(10, 40, 10) if i >= warm]  # step index i follows the evaluation after step i
    assert len(evaluated.step_times_s) == 40 - warm - len(held)
    told = [re.search(r"evaluation: (\d+) runs?, (\d+\.\d+) s", n) for n in evaluated.notes]
    told = [m for m in told if m]
    assert told and int(told[0].group(1)) == 4, evaluated.notes
    assert float(told[0].group(2)) >= 0.95 * slow.slept


def test_a_step_counts_the_train_batch_size_with_data_parallel_gpus(tmp_path, monkeypatch):
    """Under DataParallel one process drives n_gpu GPUs: its step is per_device x n_gpu samples (HF's
    train_batch_size), x accumulation."""
    bench = bench_of(tmp_path)
    args = transformers.TrainingArguments(output_dir=str(tmp_path / "out"), use_cpu=True, report_to=[],
                                          per_device_train_batch_size=4, gradient_accumulation_steps=2)
    args._n_gpu = 2  # what _setup_devices finds on a node with 2 GPUs and no process group
    assert args.train_batch_size == 8 and str(args.parallel_mode.value) == "not_distributed"
    state, control, callback = transformers.TrainerState(), transformers.TrainerControl(), wb.TrainerCallback(bench)
    callback.on_train_begin(args, state, control, model=tiny_gpt2())
    for _ in range(30):
        callback.on_step_begin(args, state, control)
        callback.on_step_end(args, state, control)
    callback.on_train_end(args, state, control)
    row = callback.result
    assert row.ok and row.samples_per_step == 16, row
    assert any("DataParallel over 2 GPUs" in n for n in row.notes), row.notes


DDP_SCRIPT = """
import sys, warnings, torch
sys.path.insert(0, {tests!r})
import workbench as wb
from test_hf import trainer_of

warnings.simplefilter("ignore")
bench = wb.Workbench.from_trainer(trainer_of(), log={log!r}, steps=3, warmup_steps=1)
callback = wb.TrainerCallback(bench)
real = trainer_of(max_steps=30, output_dir={out!r}, per_device_train_batch_size=4, ddp_backend="gloo",
                  disable_tqdm=True)
real.add_callback(callback)
real.train()
print("rank", real.args.process_index, "row", None if callback.result is None else callback.result.trial_id)
"""


@pytest.mark.slow
def test_two_torchrun_ranks_are_one_row_with_the_world_s_samples(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(DDP_SCRIPT.format(tests=str(ROOT / "tests"), log=str(tmp_path / "runs"),
                                                        out=str(tmp_path / "out"))))
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
                          str(script)], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    log, = (tmp_path / "runs").glob("*.jsonl")
    rows = [r for r in wb.ResultLog(log).trials if r.extra.get("source") == "real run"]
    assert len(rows) == 1, [r.notes for r in rows]
    row = rows[0]
    assert row.ok and row.knobs.world_size == 2 and row.knobs.strategy == "ddp"
    assert row.samples_per_step == 8  # 4 on each of 2 ranks
    assert any("2 ranks" in n for n in row.notes), row.notes

