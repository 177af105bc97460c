"""Lightning where its users train (issue 51): Workbench.from_lightning (step, optimizer and scheduler,
data, Trainer flags as starting knobs, what cannot be mapped), to_lightning (Trainer keywords that
fit), and the user's own run as referee: LightningCallback / TrainerCallback rows ("real run") and
compare(trial, run) over the run's windows. Tiny models on the CPU; the fits are a few seconds."""

from __future__ import annotations

import json
import re
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


class UsesIndex(Net):
    """training_step reads batch_idx (a condition that never holds): the compiled step guards on it."""

    def training_step(self, batch, batch_idx):
        if batch_idx < 0:
            return None
        return super().training_step(batch, batch_idx)


class CompilesItself(UsesIndex):
    def configure_model(self):
        self.net = torch.compile(self.net)


def graphs_of_a_compiled_trial(bench, knobs):
    """(Dynamo's unique graphs, the trial) of one trial in this process, Dynamo's caches emptied first."""
    from torch._dynamo.utils import counters

    from workbench.launch.runner import run_here

    torch._dynamo.reset()
    counters.clear()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trial = run_here(bench.workload, knobs, warmup_steps=2, steps=10, measure_memory=False)
    return counters["stats"]["unique_graphs"], trial


@pytest.mark.parametrize("module", [UsesIndex, CompilesItself])
def test_a_compiled_lightning_trial_compiles_once_not_per_step(module):
    """batch_idx counted inside the compiled forward recompiled every step (8 graphs, then eager)."""
    bench = bench_of(module())
    knobs = bench.knobs(compile="default") if module is UsesIndex else bench.defaults
    assert knobs.compile == "default"
    graphs, trial = graphs_of_a_compiled_trial(bench, knobs)
    assert trial.ok, trial.message
    assert graphs <= 2, f"{graphs} graphs for one compiled step: a recompile per step"


class Buckets(torch.utils.data.Sampler):
    """A length-bucketing batch_sampler (the usual way to batch text): batches of `batch_size` indices."""

    def __init__(self, n: int, batch_size: int) -> None:
        self.n, self.batch_size = n, batch_size
        self.sampler = torch.utils.data.RandomSampler(range(n))

    def __iter__(self):
        order = sorted(self.sampler, key=lambda i: i % 7)  # the "length" buckets
        return iter([order[i:i + self.batch_size] for i in range(0, self.n, self.batch_size)])

    def __len__(self):
        return -(-self.n // self.batch_size)


class BatchSamplerData(Data):
    def __init__(self, batch_sampler) -> None:
        super().__init__(n=256)
        self.batch_sampler = batch_sampler

    def train_dataloader(self):
        return DataLoader(self.ds, batch_sampler=self.batch_sampler)


def test_a_loader_on_a_batch_sampler_starts_at_its_batch_size_and_says_what_is_not_carried():
    """DataLoader(batch_sampler=...) has batch_size None: the start was batch_size=1, said nowhere."""
    with pytest.warns(UserWarning, match="batch_sampler Buckets"):
        bench = bench_of(data=BatchSamplerData(Buckets(256, 32)))
    assert bench.defaults.batch_size == 32
    assert any(u.startswith("batch_sampler Buckets (trials batch batch_size=32 over its sampler RandomSampler")
               and "group_by_length=True" in u for u in bench.unmapped)
    assert bench.workload.spec.shuffle  # the bucketing sampler's own sampler: a seeded shuffle
    trial = bench.run(progress=False)
    assert trial.ok and trial.samples_per_step == 32, trial.message
    out = bench.to_lightning(trial)
    assert any(s.startswith("batch_size (your batch_sampler Buckets") for s in out.left_out)


def test_torchs_own_batch_sampler_is_carried_whole():
    plain = torch.utils.data.BatchSampler(torch.utils.data.SequentialSampler(range(256)), 16, drop_last=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        bench = bench_of(data=BatchSamplerData(plain))
    assert bench.defaults.batch_size == 16 and bench.unmapped == []
    spec = bench.workload.spec
    assert spec.drop_last and not spec.shuffle and spec.sampler is None
    assert bench.to_lightning(bench.defaults).left_out == []


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


def test_a_configure_model_that_needs_the_mesh_says_how_to_skip_it():
    class Shards(Net):
        def configure_model(self):
            self.device_mesh["data_parallel"]  # None outside fit

    with pytest.raises(ValueError, match=r"configure_model failed outside a Trainer.*self\.device_mesh is None"):
        bench_of(Shards())


def test_a_trainer_with_max_steps_zero():
    with pytest.raises(ValueError, match="max_steps=0"):
        bench_of(tr=trainer(max_steps=0))


def test_configure_optimizers_that_needs_the_trainer_is_refused_with_the_fix():
    class NeedsTrainer(Net):
        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=1e-2)
            total = self.trainer.estimated_stepping_batches  # no Trainer is attached to the trial's copy
            return {"optimizer": opt, "lr_scheduler": torch.optim.lr_scheduler.LinearLR(opt, total_iters=total)}

    with pytest.raises(ValueError, match=r"configure_optimizers failed outside a Trainer.*from the module alone"):
        bench_of(module=NeedsTrainer())


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


def names(left_out):
    """The knob names a left_out list speaks of ('ddp_no_sync=False (...)' -> 'ddp_no_sync')."""
    return {line.split(" ")[0].split("=")[0] for line in left_out}


SET = {"batch_size": 4, "data": "cached", "amp": "bf16", "compile": "default", "cpu_threads": 1, "accum_steps": 2,
       "checkpoint": ("module.net.0",), "grad_clip_norm": 0.5, "optimizer_impl": "foreach", "world_size": 2,
       "fsdp_shard": ("module.net.0",), "allocator": "glibc-kept"}
# what the Trainer's keywords and the DataLoader arguments carry (the rest is in the snippet or left_out)
CARRIED = {
    "batch_size": lambda out, v: out.dataloader["batch_size"] == v,
    "num_workers": lambda out, v: out.dataloader["num_workers"] == v,
    "pin_memory": lambda out, v: out.dataloader["pin_memory"] == v,
    "persistent_workers": lambda out, v: out.dataloader["persistent_workers"] == v,
    "prefetch_factor": lambda out, v: out.dataloader["prefetch_factor"] == v,
    "amp": lambda out, v: out["precision"] == "bf16-mixed",
    "accum_steps": lambda out, v: out["accumulate_grad_batches"] == v,
    "grad_clip_norm": lambda out, v: out["gradient_clip_val"] == v and out["gradient_clip_algorithm"] == "norm",
    "cudnn_benchmark": lambda out, v: out["benchmark"] is v,
    "world_size": lambda out, v: out["devices"] == v,
    "ddp_no_sync": lambda out, v: out["accumulate_grad_batches"] > 1,  # Lightning's loop skips the all-reduce
    "ddp_bucket_cap_mb": lambda out, v: out["strategy"]._ddp_kwargs == {"bucket_cap_mb": v},
    "ddp_gradient_as_bucket_view": lambda out, v: out["strategy"]._ddp_kwargs == {"gradient_as_bucket_view": v},
    "ddp_static_graph": lambda out, v: out["strategy"]._ddp_kwargs == {"static_graph": v},
    "ddp_find_unused_parameters": lambda out, v: out["strategy"]._ddp_kwargs == {"find_unused_parameters": v},
    "ddp_broadcast_buffers": lambda out, v: list(out["strategy"]._ddp_kwargs.values()) == [False],
    "ddp_comm_hook": lambda out, v: out["strategy"]._ddp_comm_hook.__name__ == "fp16_compress_hook",
}


@pytest.mark.parametrize("name", [n for n in wb.Knobs().to_dict()])
def test_to_lightning_carries_every_knob_or_names_it_in_left_out(name):
    """ddp_* and most fsdp_* knobs vanished from the output and from left_out."""
    from workbench.core.knobs import KNOBS

    value = SET.get(name, KNOBS[name].probe)
    assert value is not None and value != KNOBS[name].default, name
    around = {}
    if name.startswith(("ddp_", "fsdp_")) or name == "strategy":
        around["world_size"] = 2
    if name.startswith("fsdp_"):
        around["strategy"] = "fsdp2"
    if name == "checkpoint_mode":
        around["checkpoint"] = ("module.net.0",)
    if name == "ddp_no_sync":
        around["accum_steps"] = 2
    if name == "persistent_workers" or name == "prefetch_factor":
        around["num_workers"] = 1
    bench = bench_of()
    out = bench.to_lightning(bench.knobs(**around, **{name: value}))
    assert name in names(out.left_out) or CARRIED[name](out, value), (name, out.left_out)


def test_to_lightning_of_fsdp2_is_model_parallel_strategy_and_its_configure_model_shards():
    """strategy='fsdp' is Lightning's FSDP1; FSDP2 is ModelParallelStrategy with a data-parallel mesh."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    bench = bench_of()
    knobs = bench.knobs(world_size=2, strategy="fsdp2", amp="bf16", fsdp_param_dtype="bf16", fsdp_prefetch=1)
    out = bench.to_lightning(knobs)
    strategy = out["strategy"]
    assert isinstance(strategy, L.strategies.ModelParallelStrategy)
    assert (strategy._data_parallel_size, strategy._tensor_parallel_size) == (2, 1)
    assert {"strategy", "fsdp_param_dtype", "fsdp_prefetch"} <= set(out.left_out)
    assert type(L.Trainer(**out, logger=False).strategy) is L.strategies.ModelParallelStrategy
    ns = {}
    exec(out.code, ns)
    Sharded = type("Sharded", (Net,), {"configure_model": ns["configure_model"]})
    module = Sharded()
    module.configure_model()  # outside fit (no mesh): nothing is sharded
    assert not any(type(m).__name__.startswith("FSDP") for m in module.modules())
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    try:
        module._device_mesh = init_device_mesh("cpu", (1,), mesh_dim_names=("data_parallel",))
        module.configure_model()  # inside fit: each block, then the module, sharded as trials shard
        assert [n for n, m in module.named_modules() if type(m).__name__.startswith("FSDP")] == ["", "net.0", "net.2"]
        x, y = torch.randn(4, 8), torch.randint(0, 4, (4,))
        module.training_step((x, y), 0)["loss"].backward()
    finally:
        dist.destroy_process_group()


def test_ddp_knobs_go_out_as_a_ddp_strategy_and_come_back():
    bench = bench_of()
    knobs = bench.knobs(world_size=2, ddp_bucket_cap_mb=5, ddp_gradient_as_bucket_view=True,
                        ddp_find_unused_parameters=True, ddp_broadcast_buffers=False, ddp_comm_hook="fp16",
                        accum_steps=2, ddp_no_sync=True)
    out = bench.to_lightning(knobs)
    assert isinstance(out["strategy"], L.strategies.DDPStrategy) and out.left_out == []
    back = bench_of(tr=trainer(**{**out, "accelerator": "cpu"}))  # the Trainer read back: the same knobs
    assert {n: v for n, v in back.defaults.diff(knobs).items() if n != "batch_size"} == {}
    assert bench.to_lightning(bench.knobs(world_size=2)).get("strategy") == "ddp"  # DDP's defaults: the name


def test_the_trainers_strategy_maps_fsdp1_and_fsdp2_and_says_which():
    from workbench.faces.lightning_parallel import strategy_knobs

    k, left = strategy_knobs(L.strategies.FSDPStrategy(), 2, 2, 1)  # a Trainer refuses FSDP on a CPU
    assert k == {"world_size": 2, "strategy": "fsdp2"} and "FSDP1" in left[0] and "ModelParallelStrategy" in left[0]
    two = L.strategies.ModelParallelStrategy(data_parallel_size=2, tensor_parallel_size=1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bench = bench_of(tr=trainer(devices=2, strategy=two))
    assert (bench.defaults.world_size, bench.defaults.strategy) == (2, "fsdp2")
    k, left = strategy_knobs(L.strategies.ModelParallelStrategy(), 2, 2, 1)  # "auto": tensor parallel on one node
    assert k == {} and "tensor_parallel_size=2" in left[0]


def test_deterministic_detect_anomaly_and_sync_batchnorm_are_said():
    """A run with detect_anomaly=True is far slower than its trials, and nothing said so."""
    try:
        with pytest.warns(UserWarning, match="could not map") as got:
            bench = bench_of(tr=trainer(deterministic=True, detect_anomaly=True, sync_batchnorm=True))
    finally:
        torch.use_deterministic_algorithms(False)  # the Trainer set it for the whole process
    text = " ".join(str(w.message) for w in got)
    for said in ("deterministic=True", "detect_anomaly=True", "far slower than its trials", "sync_batchnorm=True"):
        assert said in text and any(said in u for u in bench.unmapped), said


@pytest.mark.slow
@pytest.mark.parametrize(("which", "strategy", "module"), [("ddp", "DDPStrategy", "Exported"),
                                                          ("fsdp2", "ModelParallelStrategy", "FSDPExported")])
def test_what_to_lightning_exports_fits_on_two_gloo_ranks(which, strategy, module):
    """The exported strategy and configure_model in a real two-process fit (DDP knobs; FSDP2 sharding)."""
    from rank_failures import job_output

    proc = subprocess.run([sys.executable, str(ROOT / "tests" / "lightning_two_ranks.py"), which],
                          capture_output=True, text=True, cwd=ROOT, timeout=600)
    assert proc.returncode == 0, job_output(proc)
    ranks = sorted(re.findall(r"rank (\d): steps=(\d+) strategy=(\w+) modules=(\w+),", proc.stdout))
    assert ranks == [("0", "3", strategy, module), ("1", "3", strategy, module)], job_output(proc)


class ConvNet(L.LightningModule):
    """Dict batches {"image": N,3,8,8, "label": N}; asserts in training_step what the snippet promises."""

    def __init__(self) -> None:
        super().__init__()
        self.body = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3, padding=1), torch.nn.ReLU())
        self.head = torch.nn.Linear(4 * 8 * 8, 2)
        self.seen = []

    def training_step(self, batch, batch_idx):
        image = batch["image"]  # a dict still (the old snippet made it a list of its keys)
        self.seen.append(image.is_contiguous(memory_format=torch.channels_last))
        return torch.nn.functional.cross_entropy(self.head(self.body(image).flatten(1)), batch["label"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class DictData(L.LightningDataModule):
    def setup(self, stage=None):
        g = torch.Generator().manual_seed(0)
        images, labels = torch.randn(64, 3, 8, 8, generator=g), torch.randint(0, 2, (64,), generator=g)
        self.ds = [{"image": images[i], "label": labels[i]} for i in range(64)]

    def train_dataloader(self):
        return DataLoader(self.ds, batch_size=8)


def test_the_snippet_fits_on_dict_batches_with_channels_last_and_selective_checkpointing(monkeypatch, tmp_path):
    """The snippet is run, not string-matched: channels_last on a dict batch, selective checkpointing."""
    import torch.utils.checkpoint as ckpt

    bench = bench_of(ConvNet(), DictData())
    out = bench.to_lightning(bench.knobs(channels_last=True, checkpoint=["module.body"], checkpoint_mode="selective"))
    ns = {}
    exec(out.code, ns)
    hooks = {n: ns[n] for n in ("on_fit_start", "on_after_batch_transfer", "configure_model")}
    module = type("Exported", (ConvNet,), hooks)()
    calls = []
    real = ckpt.checkpoint

    def recorded(fn, *args, **kwargs):
        calls.append(kwargs.get("context_fn"))
        return real(fn, *args, **kwargs)

    monkeypatch.setattr(ckpt, "checkpoint", recorded)
    t = L.Trainer(**out, max_steps=3, logger=False, enable_checkpointing=False, enable_progress_bar=False,
                  enable_model_summary=False, default_root_dir=tmp_path)
    t.fit(module, DictData())
    assert t.global_step == 3 and module.seen == [True] * 3
    assert len(calls) == 3 and all(c is not None and c.func is ckpt.create_selective_checkpoint_contexts
                                   for c in calls)


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
