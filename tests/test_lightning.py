"""Lightning where its users train (issue 51): Workbench.from_lightning (step, optimizer and scheduler,
data, Trainer flags as starting knobs, what cannot be mapped), to_lightning (Trainer keywords that
fit), and the user's own run as referee: LightningCallback / TrainerCallback rows ("real run") and
compare(trial, run) over the run's windows. Tiny models on the CPU; the fits are a few seconds."""

from __future__ import annotations

import json
import subprocess
import sys
import warnings

import pytest
import torch
from conftest import ROOT
from torch.utils.data import DataLoader, TensorDataset

import workbench as wb
from workbench.core.knobs import context
from workbench.core.knobs.optimizer import rebuild_optimizer
from workbench.core.measure import TrialResult
from workbench.faces import realrun
from workbench.faces.realrun import RunMeter, compare_real
from workbench.results.stats import PRIOR, Noise

L = pytest.importorskip("lightning.pytorch")

QUIET = dict(logger=False, enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
             accelerator="cpu", devices=1)


class Net(L.LightningModule):
    """A tiny classifier with a scheduler in configure_optimizers and self.log in training_step."""

    def __init__(self, interval: str = "step", skip_from: int | None = None) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 4))
        self.interval, self.skip_from = interval, skip_from

    def forward(self, x):
        return self.net(x)

    def training_step(self, batch, batch_idx):
        if self.skip_from is not None and batch_idx >= self.skip_from:
            return None
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self(x), y)
        self.log("train_loss", loss)
        self.log_dict({"also": loss})
        return {"loss": loss}

    def configure_optimizers(self):
        opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
        sched = torch.optim.lr_scheduler.StepLR(opt, step_size=2, gamma=0.5)
        return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": self.interval}}


class Data(L.LightningDataModule):
    def __init__(self, n: int = 256, batch_size: int = 8, workers: int = 0) -> None:
        super().__init__()
        self.n, self.batch_size, self.workers = n, batch_size, workers

    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        self.ds = TensorDataset(torch.randn(self.n, 8, generator=g), torch.randint(0, 4, (self.n,), generator=g))

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=self.batch_size, shuffle=True, num_workers=self.workers,
                          persistent_workers=self.workers > 0)


def trainer(**kw):
    return L.Trainer(**{**QUIET, **kw})


def bench_of(module=None, data=None, tr=None, **kw):
    kw.setdefault("log", None)
    kw.setdefault("steps", 4)
    kw.setdefault("warmup_steps", 1)
    return wb.Workbench.from_lightning(module or Net(), data or Data(), tr, **kw)


# ---- from_lightning ---------------------------------------------------------------------------------
@pytest.mark.slow
def test_held_out_module_datamodule_trainer_trial_export_real_run_and_referee(tmp_path):
    """The issue's held-out check: scheduler + self.log, 2 workers, bf16-mixed, accumulation 2, clipping 1.0."""
    module, data = Net(), Data(n=4096, workers=2)
    before = {k: v.clone() for k, v in module.state_dict().items()}
    tr = trainer(precision="bf16-mixed", accumulate_grad_batches=2, gradient_clip_val=1.0)
    bench = wb.Workbench.from_lightning(module, data, tr, log=tmp_path / "runs", steps=20, warmup_steps=2)
    d = bench.defaults
    assert (d.amp, d.accum_steps, d.grad_clip_norm, d.num_workers, d.batch_size) == ("bf16", 2, 1.0, 2, 8)
    trial = bench.run(progress=False)
    assert trial.ok, trial.message
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())  # never trained
    kw = bench.to_lightning(trial)
    assert kw["precision"] == "bf16-mixed" and kw["accumulate_grad_batches"] == 2 and kw["gradient_clip_val"] == 1.0
    check = L.Trainer(**kw, max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                      enable_model_summary=False)
    check.fit(Net(), Data(n=64, workers=0))
    assert check.global_step == 3
    callback = wb.LightningCallback(bench)
    real = L.Trainer(**kw, max_steps=200, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                     enable_model_summary=False, callbacks=[callback])
    real.fit(Net(), data)
    row = callback.result
    assert row.ok and row.extra["source"] == "real run" and row.knobs == trial.knobs
    frame = bench.results
    assert frame.loc[frame.trial_id == row.trial_id, "source"].item() == "real run"
    assert bench.baseline.trial_id == trial.trial_id  # a real run is never the default baseline
    c = bench.compare(trial, row)
    assert c.answer == "same" or "Evidence:" in c.note, str(c)
    assert "windows of 20 steps" in c.note


def test_starting_knobs_from_the_loader_and_trainer_flags():
    tr = trainer(precision="32-true", accumulate_grad_batches=3, benchmark=False)
    bench = bench_of(data=Data(workers=1), tr=tr)
    d = bench.defaults
    assert (d.amp, d.accum_steps, d.num_workers, d.persistent_workers, d.grad_clip_norm) == ("off", 3, 1, True, None)
    assert bench.unmapped == []


def test_a_trial_never_changes_the_module_and_self_log_is_quiet():
    module = Net()
    before = {k: v.clone() for k, v in module.state_dict().items()}
    bench = bench_of(module)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # Lightning's "self.log() without a Trainer" would be a warning per call
        r = bench.run(progress=False)
    assert r.ok, r.message
    assert all(torch.equal(before[k], v) for k, v in module.state_dict().items())
    assert "log" not in module.__dict__  # the no-op log is on the trial's copy only


@pytest.mark.parametrize(("interval", "steps", "expected"), [("step", 4, 0.25), ("epoch", 4 * 32, 0.25),
                                                            ("epoch", 32, 1.0)])
def test_the_scheduler_steps_as_lightning_would(interval, steps, expected):
    """StepLR(step_size=2, gamma=0.5): after 4 steps ('step') or 4 epochs of 32 steps ('epoch') lr is 1/4."""
    bench = bench_of(Net(interval=interval))
    model = bench.workload.fresh_model()
    opt = bench.workload.optimizer_factory(model.parameters())
    for _ in range(steps):
        opt.step()
    assert opt.param_groups[0]["lr"] == pytest.approx(1e-2 * expected)


def test_a_rebuilt_optimizer_keeps_stepping_the_scheduler():
    bench = bench_of()
    model = bench.workload.fresh_model()
    opt = bench.workload.optimizer_factory(model.parameters())
    ctx = context(wb.Knobs(), torch.device("cpu"), notes=[])
    fast = rebuild_optimizer(opt, "foreach", ctx)
    assert fast is not opt
    for _ in range(4):
        fast.step()
    assert fast.param_groups[0]["lr"] == pytest.approx(1e-2 / 4)


def test_unmapped_flags_are_listed_in_one_warning_and_kept():
    class Mine(L.Callback):
        pass

    tr = trainer(gradient_clip_val=0.5, gradient_clip_algorithm="value", callbacks=[Mine()])
    with pytest.warns(UserWarning, match="from_lightning could not map") as got:
        bench = bench_of(tr=tr)
    assert len([w for w in got if "could not map" in str(w.message)]) == 1
    assert any("gradient_clip_algorithm='value'" in u for u in bench.unmapped)
    assert any("Mine" in u for u in bench.unmapped)
    assert bench.defaults.grad_clip_norm is None


def test_a_module_compiling_itself_in_configure_model_starts_at_compile_default():
    class Compiles(Net):
        def configure_model(self):
            self.net = torch.compile(self.net)

    bench = bench_of(Compiles())
    assert bench.defaults.compile == "default"
    assert not any(isinstance(m, torch._dynamo.eval_frame.OptimizedModule) for m in bench.workload.pristine.modules())


# ---- bad input: a clear error, nothing lost ------------------------------------------------------------
def test_training_step_returning_none_ends_the_trial_with_the_fix():
    bench = bench_of(Net(skip_from=3))
    r = bench.run(progress=False)
    assert r.status == "error"
    assert "training_step returned None at batch_idx 3" in r.message and "Return the loss" in r.message
    with pytest.raises(ValueError, match="training_step returned None at batch_idx 0"):
        bench_of(Net(skip_from=0))


def test_two_optimizers_are_refused_with_the_reason():
    class Two(Net):
        def configure_optimizers(self):
            return [torch.optim.SGD(self.net[0].parameters(), lr=0.1), torch.optim.SGD(self.net[2].parameters(), lr=0.1)]

    with pytest.raises(ValueError, match="returned 2 optimizers"):
        bench_of(Two())


def test_manual_optimization_is_refused_with_the_reason():
    class Manual(Net):
        def __init__(self):
            super().__init__()
            self.automatic_optimization = False

    with pytest.raises(ValueError, match="manual optimization"):
        bench_of(Manual())


def test_a_datamodule_without_train_dataloader():
    class NoLoader(L.LightningDataModule):
        pass

    with pytest.raises(ValueError, match=r"has no train_dataloader\(\)"):
        bench_of(data=NoLoader())


def test_a_trainer_with_max_steps_zero():
    with pytest.raises(ValueError, match="max_steps=0"):
        bench_of(tr=trainer(max_steps=0))


def test_bf16_true_is_refused_with_how_it_maps():
    with pytest.raises(ValueError, match="bf16-mixed"):
        bench_of(tr=trainer(precision="bf16-true"))


# ---- back out -----------------------------------------------------------------------------------------
def test_to_lightning_fits_and_says_what_has_no_flag(tmp_path):
    bench = bench_of()
    knobs = bench.knobs(channels_last=True, cpu_threads=1, checkpoint=["module.net.0"], compile="default",
                        allocator="glibc-kept", grad_clip_norm=0.5)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        kw = bench.to_lightning(knobs)
    for name in ("channels_last", "cpu_threads", "checkpoint", "compile", "allocator"):
        assert name in kw.left_out
    assert "torch.set_num_threads(1)" in kw.code and "['net.0']" in kw.code and "torch.compile(module)" in kw.code
    assert kw["gradient_clip_algorithm"] == "norm" and kw.dataloader["batch_size"] == 8
    plain = bench.to_lightning(bench.defaults)
    assert plain.code == "" and plain.left_out == []
    t = L.Trainer(**plain, max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=tmp_path)
    t.fit(Net(), Data(n=64))
    assert t.global_step == 3


# ---- the referee --------------------------------------------------------------------------------------
def test_the_lightning_callback_lands_a_real_run_row(tmp_path):
    bench = bench_of(log=tmp_path / "runs")
    trial = bench.run(progress=False)
    callback = wb.LightningCallback(bench)
    t = L.Trainer(**bench.to_lightning(trial), max_steps=60, logger=False, enable_checkpointing=False,
                  enable_progress_bar=False, enable_model_summary=False, callbacks=[callback])
    t.fit(Net(), Data(n=2048))
    row = callback.result
    assert row.ok and row.extra["source"] == "real run" and row.extra["framework"] == "lightning"
    assert row.samples_per_step == 8 and row.knobs == trial.knobs
    assert len(row.step_times_s) == 60 - row.extra["warmup_rule"]["steps"]
    again = wb.ResultLog(bench.log.path)  # the row reads back from the file
    assert again.get(row.trial_id).extra["source"] == "real run"
    c = bench.compare(trial, row)
    assert c.answer in ("same", "faster", "slower", "undecided") and "is cut into" in c.note


def fake_steps(monkeypatch, durations):
    """RunMeter over fake step durations (seconds): the clock advances by each as the step ends."""
    clock = [0.0]
    monkeypatch.setattr(realrun.time, "perf_counter", lambda: clock[0])
    meter = RunMeter(knobs=wb.Knobs(batch_size=4), device=torch.device("cpu"), framework="test", warmup_steps=2)
    meter.start()
    for i, d in enumerate(durations):
        if i == 12:
            meter.pause("validation")  # validation ran before step 13: it is left out
        meter.batch((torch.zeros(4, 2),))
        clock[0] += d
        meter.batch_done(torch.tensor(1.0))
        meter.step()
    return meter.result()


def test_the_meter_applies_the_warm_up_rule_and_leaves_validation_out(monkeypatch):
    row = fake_steps(monkeypatch, [1.0] + [0.1] * 40)
    warm = row.extra["warmup_rule"]["steps"]
    assert row.extra["warmup_rule"]["ended"] == "steady" and warm >= 2
    assert len(row.step_times_s) == 41 - warm - 1  # the validation step is left out
    assert row.samples_per_s == pytest.approx(40.0) and row.samples_per_step == 4
    assert any("left out of the window" in n for n in row.notes)


def test_a_run_too_short_for_a_window_is_an_error_row_saying_so(monkeypatch):
    row = fake_steps(monkeypatch, [1.0, 0.1])
    assert row.status == "error" and "train longer" in row.message


def trial_row(rate: float, steps: int = 10, tid: int = 1, real: bool = False) -> TrialResult:
    times = tuple((8 / rate) * (1 + 0.01 * ((i % 3) - 1)) for i in range(steps))
    return TrialResult(knobs=wb.Knobs(batch_size=8), status="ok", samples_per_s=8 * steps / sum(times),
                       step_times_s=times, data_wait_s=(0.0,) * steps, data_wait_share=0.0, samples_per_step=8,
                       trial_id=tid, extra={"source": "real run", "framework": "lightning",
                                            "warmup_rule": {"steps": 5}} if real else {})


def test_compare_judges_the_run_in_windows_as_long_as_the_trial():
    quiet = Noise(sigma=0.01, df=100, repeats=50, configs=5)  # a log whose repeats agree within 1%
    same = compare_real(trial_row(100.0), trial_row(100.0, steps=60, tid=2, real=True), noise=quiet)
    assert same.answer == "same" and len(same.b_rates) == 6 and "6 windows of 10 steps" in same.note
    slow = compare_real(trial_row(100.0), trial_row(50.0, steps=60, tid=2, real=True), noise=PRIOR)
    assert slow.answer == "slower" and "Evidence:" in slow.note and "ms per step" in slow.note
    one = compare_real(trial_row(100.0), trial_row(100.0, steps=60, tid=2, real=True), noise=PRIOR)
    assert one.answer == "undecided" and "repeat the trial" in str(one) and "1 trials vs" not in str(one)  # one trial under the prior


def test_the_core_never_imports_lightning_or_transformers(tmp_path):
    script = f"""
import sys, json
sys.modules["lightning"] = sys.modules["lightning.pytorch"] = sys.modules["transformers"] = None
sys.path.insert(0, {str(ROOT / 'tests')!r})
import torch, workbench as wb
from conftest import TinyNet, tiny_data
bench = wb.Workbench(TinyNet(), tiny_data(), loss_fn=torch.nn.CrossEntropyLoss(), steps=2, warmup_steps=1, log=None)
errors = {{}}
for name in ("LightningCallback", "TrainerCallback"):
    try:
        getattr(wb, name)
    except ImportError as e:
        errors[name] = str(e)
print(json.dumps({{"status": bench.run(progress=False).status, "errors": errors}}))
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert out.returncode == 0, out.stderr
    got = json.loads(out.stdout.strip().splitlines()[-1])
    assert got["status"] == "ok"
    assert "[lightning]" in got["errors"]["LightningCallback"] and "[hf]" in got["errors"]["TrainerCallback"]


@pytest.mark.slow
def test_the_trainer_callback_lands_a_real_run_row(tmp_path):
    """The same check with a Hugging Face Trainer: from_trainer, a trial, train() with wb.TrainerCallback."""
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from test_hf import trainer_of

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bench = wb.Workbench.from_trainer(trainer_of(), log=tmp_path / "runs", steps=4, warmup_steps=1)
    trial = bench.run(progress=False)
    assert trial.ok, trial.message
    callback = wb.TrainerCallback(bench)
    real = trainer_of(max_steps=30, include_num_input_tokens_seen=True, output_dir=str(tmp_path / "out"))
    real.add_callback(callback)
    real.train()
    row = callback.result
    assert row.ok and row.extra["source"] == "real run" and row.extra["framework"] == "transformers"
    assert row.samples_per_step == 16 and row.tokens_per_s and row.knobs.batch_size == trial.knobs.batch_size
    c = bench.compare(trial, row)
    assert "is cut into" in c.note and (c.answer == "same" or "Evidence:" in c.note)


def test_a_real_run_row_is_never_the_baseline_nor_a_repeat():
    log = wb.ResultLog(None)
    log.append(trial_row(50.0, steps=60, tid=1, real=True))  # the run lands first
    trial = log.append(trial_row(100.0))
    log.append(trial_row(101.0))
    noise = log.noise
    log.append(trial_row(100.0, steps=60, real=True))
    assert log.baseline.trial_id == trial.trial_id
    assert log.noise == noise  # a real run of the same knobs is no repeat of the trials
    frame = log.frame()
    assert list(frame["source"]) == ["real run", "trial", "trial", "real run"]
    assert frame["verdict"].iloc[3] == "" and frame["speedup"].iloc[3] == pytest.approx(1.0, rel=0.05)
