"""What we export is what we measured: for every batch format and loss source a user brings, the
script `Workbench.to_code()` writes computes the trial's per-step losses, under every knob one
process can run; what it cannot carry over it says at its top."""

from __future__ import annotations

import copy
import re
import subprocess
import sys
import textwrap
from types import SimpleNamespace

import pytest
import torch
from conftest import ROOT, TinyNet
from rank_failures import job_output
from test_step import NOT_HERE, switched_on
from torch import nn
from torch.utils.data import Dataset

import workbench as wb
from workbench.core.step import seeded
from workbench.results import ResultLog


class Blocks(TinyNet):
    """conftest's TinyNet (two residual blocks in a ModuleList, so checkpoint=('blocks.0',) has
    something to act on), its forward renamed `logits` for the shapes below to call."""

    logits = TinyNet.forward


class TupleNet(Blocks):
    def forward(self, x):
        return self.logits(x)


class DictNet(Blocks):
    """Hugging Face style: keyword inputs, returns a dict holding its own loss."""

    def forward(self, input_ids, labels, attention_mask=None):
        logits = self.logits(input_ids * attention_mask)
        return {"loss": nn.functional.cross_entropy(logits, labels), "logits": logits}


class NestedNet(Blocks):
    """Nested inputs: ((features, mask), target) batches."""

    def forward(self, pair):
        x, mask = pair
        return self.logits(x * mask)


class OwnLossNet(Blocks):
    """Tuple batches, no loss_fn: returns an object with `.loss` (ModelOutput-like)."""

    def forward(self, x, y):
        logits = self.logits(x)
        return SimpleNamespace(loss=nn.functional.cross_entropy(logits, y), logits=logits)


class StepNet(Blocks):
    def forward(self, x):
        return self.logits(x)


def dict_step(model, batch):
    """A module-level step_fn: the script imports it."""
    return nn.functional.cross_entropy(model(batch["features"]["x"]), batch["target"])


class Samples(Dataset):
    """24 seeded samples in the format `kind` asks for (strings ride along: they must not be moved)."""

    def __init__(self, kind: str, n: int = 24) -> None:
        g = torch.Generator().manual_seed(3)
        self.kind, self.x, self.y = kind, torch.randn(n, 8, generator=g), torch.randint(0, 4, (n,), generator=g)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i):
        x, y = self.x[i], self.y[i]
        if self.kind == "dict":
            return {"input_ids": x, "attention_mask": torch.ones(8), "labels": y}
        if self.kind == "nested":
            return (x, torch.ones(8)), y
        if self.kind == "step_fn":
            return {"features": {"x": x}, "target": y, "id": f"sample-{i}"}
        return x, y


SHAPES = {  # name: (model class, Workbench keywords)
    "tuple": (TupleNet, {"loss_fn": nn.CrossEntropyLoss()}),
    "dict": (DictNet, {}),
    "nested": (NestedNet, {"loss_fn": nn.CrossEntropyLoss()}),
    "own_loss": (OwnLossNet, {}),
    "step_fn": (StepNet, {"step_fn": dict_step}),
}


def workbench_for(shape: str) -> tuple[wb.Workbench, dict]:
    """A Workbench of that shape (3 measured steps after 2 warm-up) and the names its script needs."""
    make, kwargs = SHAPES[shape]
    torch.manual_seed(0)
    model, data = make(), Samples("tuple" if shape == "own_loss" else shape)
    opt = lambda p: torch.optim.SGD(p, lr=0.1)  # noqa: E731
    bench = wb.Workbench(model, data, optimizer=opt, steps=3, warmup_steps=2, log=None, **kwargs)
    return bench, {"model": model, "dataset": data, "make_optimizer": opt, **kwargs}


def with_loss_probe(code: str) -> str:
    """The script with `seen_losses.append(...)` after each loss line (at its indentation)."""
    out = []
    for line in code.splitlines():
        out.append(line)
        stripped = line.lstrip()
        if stripped.startswith("loss = "):
            out.append(line[: len(line) - len(stripped)] + "seen_losses.append(loss.detach().float().item())")
    return "\n".join(out) + "\n"


def script_losses(bench: wb.Workbench, knobs: wb.Knobs, names: dict, steps: int) -> list[float]:
    """Per-step losses (mean over micro-batches) of the exported script, run in this process."""
    ns = {**names, "model": copy.deepcopy(names["model"]), "seen_losses": [], "__name__": "__exported__"}
    threads = torch.get_num_threads()
    with seeded(0):
        try:
            exec(compile(with_loss_probe(bench.to_code(knobs, steps=steps, warmup=0)), "<exported>", "exec"), ns)
        finally:
            torch.set_num_threads(threads)
            torch.set_float32_matmul_precision("highest")
    k, seen = knobs.accum_steps, ns["seen_losses"]
    return [sum(seen[i * k:(i + 1) * k]) / k for i in range(steps)]


def script_losses_for(bench: wb.Workbench, knobs: wb.Knobs, names: dict, result) -> list[float]:
    """The script's per-step losses over as many steps as the trial ran (its warm-up, steady or
    fixed, then its measured window)."""
    return script_losses(bench, knobs, names, result.extra["warmup_steps"] + len(result.losses))


def trial_window(result, script: list[float]) -> list[float]:
    """The script's losses at the steps the trial measured (after its warm-up)."""
    return script[result.extra["warmup_steps"]:]


def assert_script_is_the_trial(shape: str, knobs: wb.Knobs) -> None:
    bench, names = workbench_for(shape)
    result = bench.run(knobs, progress=False)
    assert result.ok, result.message
    assert result.extra["step"]["batch"] == bench.step_shape.batch
    assert result.losses == pytest.approx(trial_window(result, script_losses_for(bench, knobs, names, result)),
                                          abs=1e-5, rel=0)


@pytest.mark.parametrize("shape", list(SHAPES))
def test_the_script_computes_the_trials_losses_for_every_batch_and_loss_shape(shape):
    assert_script_is_the_trial(shape, wb.Knobs(batch_size=4, accum_steps=2))


SINGLE_PROCESS = [n for n in wb.knob_names() if n not in NOT_HERE and not n.startswith(("ddp_", "fsdp_"))]


@pytest.mark.slow
@pytest.mark.parametrize("name", SINGLE_PROCESS)
@pytest.mark.parametrize("shape", [s for s in SHAPES if s != "tuple"])  # tuple: test_step, per knob
def test_every_knob_keeps_the_script_equal_to_the_trial_on_every_shape(shape, name):
    assert_script_is_the_trial(shape, wb.Knobs(**{"batch_size": 4, **switched_on(name)}))


def test_a_lambda_step_fn_is_said_at_the_top_and_warned():
    torch.manual_seed(0)
    bench = wb.Workbench(StepNet(), Samples("step_fn"), step_fn=lambda m, b: dict_step(m, b), log=None)
    with pytest.warns(UserWarning, match="lambda"):
        code = bench.to_code(steps=2)
    head = code.splitlines()[:4]
    assert any(line.startswith("# NOT CARRIED OVER: step_fn is a lambda") for line in head), head
    with pytest.raises(SystemExit, match="needs step_fn defined above it"):  # never a loop doing something else
        exec(code, {"model": StepNet(), "dataset": Samples("step_fn"), "make_optimizer": torch.optim.SGD})


def test_a_missing_object_stops_the_script_naming_it_and_an_example():
    bench, names = workbench_for("dict")
    code = bench.to_code(steps=2)
    with pytest.raises(SystemExit) as stop:
        exec(code, {"model": names["model"]})
    message = str(stop.value)
    assert "needs dataset, make_optimizer" in message and "dataset = MyDataset()" in message
    assert "input_ids" in message  # the example says what the dataset yields


def test_setup_code_defines_the_objects_in_place():
    bench, _ = workbench_for("tuple")
    setup = textwrap.dedent("""
        from test_codegen_shapes import Samples, TupleNet
        model, dataset = TupleNet(), Samples("tuple")
        loss_fn = torch.nn.CrossEntropyLoss()
        make_optimizer = lambda params: torch.optim.SGD(params, lr=0.1)
    """)
    ns: dict = {}
    exec(bench.to_code(steps=2, setup=setup), ns)
    assert ns["step"] == 2


def test_a_custom_sampler_and_collate_fn_are_carried_over():
    from torch.utils.data import DataLoader

    data = Samples("tuple")
    order = list(reversed(range(len(data))))

    def collate(items):
        return torch.stack([x for x, _ in items]), torch.stack([y for _, y in items])

    torch.manual_seed(0)
    model = TupleNet()
    loader = DataLoader(data, batch_size=4, sampler=order, collate_fn=collate)
    bench = wb.Workbench(model, loader, loss_fn=nn.CrossEntropyLoss(), steps=2, warmup_steps=1, log=None,
                         optimizer=lambda p: torch.optim.SGD(p, lr=0.1))
    knobs = wb.Knobs(batch_size=4)
    result = bench.run(knobs, progress=False)
    code = bench.to_code(knobs)
    assert "sampler=sampler" in code and "collate_fn=collate_fn" in code
    names = {"model": model, "dataset": data, "loss_fn": nn.CrossEntropyLoss(), "sampler": order,
             "collate_fn": collate, "make_optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
    assert result.losses == pytest.approx(trial_window(result, script_losses_for(bench, knobs, names, result)),
                                          abs=1e-5, rel=0)


FACTORY = '''
import torch
from torch import nn
from torch.utils.data import TensorDataset


def make():
    """A deterministic workload: dict of the Workbench's arguments, as the CLI's --model takes."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))
    g = torch.Generator().manual_seed(1)
    data = TensorDataset(torch.randn(64, 8, generator=g), torch.randint(0, 4, (64,), generator=g))
    return {"model": model, "data": data, "loss_fn": nn.CrossEntropyLoss(),
            "optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
'''


def run_script(path, cwd) -> str:
    proc = subprocess.run([sys.executable, str(path)], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin", "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, job_output(proc)
    return proc.stdout


@pytest.mark.slow
def test_a_factory_workbenchs_script_runs_with_no_edits(tmp_path):
    """`workbench run --model mytrain:make --code train.py`, then `python train.py` as it is."""
    (tmp_path / "mytrain.py").write_text(FACTORY)
    proc = subprocess.run([sys.executable, "-m", "workbench", "run", "--model", "mytrain:make", "--steps", "3",
                           "--warmup-steps", "1", "--log", "none", "--quiet", "--batch-size", "8",
                           "--code", "train.py"], cwd=tmp_path, capture_output=True, text=True, timeout=300,
                          env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert proc.returncode == 0, job_output(proc)
    code = (tmp_path / "train.py").read_text()
    # the script names the trial's knobs, with the allocator mode its process ran in pinned (issue 43)
    assert "load_parts('mytrain:make')" in code and "Knobs(batch_size=8, allocator=" in code
    assert "samples/s over" in run_script(tmp_path / "train.py", tmp_path)


@pytest.mark.slow
def test_a_demos_script_runs_with_no_edits(tmp_path):
    bench = wb.demo("transformer", size="tiny", log=None)
    (tmp_path / "train.py").write_text(bench.to_code(steps=3, warmup=1))
    assert re.search(r"samples/s over \d+ timed steps", run_script(tmp_path / "train.py", tmp_path))


def test_a_reloaded_logs_trial_exports_its_own_step(tmp_path):
    bench, _ = workbench_for("dict")
    bench._log_to(tmp_path / "log.jsonl")
    bench.run(wb.Knobs(batch_size=4), progress=False)
    code = ResultLog(tmp_path / "log.jsonl").trials[-1].to_code()  # another session reads the log
    assert "model_loss(step_model(**batch))" in code and "dict batches (input_ids" in code
