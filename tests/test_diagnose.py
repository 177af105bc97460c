"""diagnose/: compile watch, the analyses, the decision tree, and bench.diagnose() end to end."""

from __future__ import annotations

import json
import os
import re
import sys
import time
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.data import Dataset, TensorDataset

import workbench as wb
from workbench.core.measure import TrialResult
from workbench.diagnose import CompileWatch, Diagnosis, explain_compile
from workbench.diagnose.data import DataCheck, check_data, loader_rate, short_circuit_knobs
from workbench.diagnose.flops import compute_dtype, flops_per_step, gpu_peak_flops
from workbench.diagnose.memory import block_activation_bytes, memory_breakdown
from workbench.diagnose.profile import profile_step
from workbench.diagnose.threads import thread_check
from workbench.diagnose.verdict import decide


class SlowData(Dataset):
    """Tensors behind a busy-wait __getitem__: a data pipeline far slower than the step."""

    def __init__(self, n: int = 128, delay_s: float = 0.004) -> None:
        g = torch.Generator().manual_seed(0)
        self.x = torch.randn(n, 16, generator=g)
        self.y = torch.randint(0, 4, (n,), generator=g)
        self.delay_s = delay_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int):
        t = time.perf_counter()
        while time.perf_counter() - t < self.delay_s:
            pass
        return self.x[i], self.y[i]


class Blocks(nn.Module):
    """Two blocks; block 1 is 8x wider, so it saves far more activations."""

    def __init__(self) -> None:
        super().__init__()
        self.blocks = nn.ModuleList([nn.Sequential(nn.Linear(16, 16), nn.ReLU()),
                                     nn.Sequential(nn.Linear(16, 128), nn.ReLU(), nn.Linear(128, 16), nn.ReLU())])
        self.head = nn.Linear(16, 4)

    def forward(self, x):
        for b in self.blocks:
            x = b(x)
        return self.head(x)


def make_bench(data=None, **kw) -> wb.Workbench:
    data = data if data is not None else TensorDataset(torch.randn(128, 16), torch.randint(0, 4, (128,)))
    return wb.Workbench(Blocks(), data, loss_fn=nn.CrossEntropyLoss(), log=None, steps=3, warmup_steps=1,
                        knobs=wb.Knobs(batch_size=16), **kw)


def fake_result(trial_id: int, step_s: float, *, status: str = "ok", wait: float = 0.0, batch: int = 16,
                knobs: wb.Knobs | None = None, extra: dict | None = None, n: int = 8) -> TrialResult:
    """A synthetic trial with steady step times (slightly jittered so the bootstrap has spread)."""
    times = tuple(step_s * (1 + 0.01 * ((i % 3) - 1)) for i in range(n)) if status == "ok" else ()
    return TrialResult(knobs=knobs or wb.Knobs(batch_size=batch), status=status, trial_id=trial_id,
                       samples_per_s=batch / step_s if status == "ok" else None,
                       step_time_s=step_s if status == "ok" else None, step_times_s=times,
                       data_wait_share=wait, samples_per_step=batch, peak_memory_bytes=1000,
                       message="" if status == "ok" else "out of memory in the model's forward",
                       extra=extra or {})


# ---- compile watch ---------------------------------------------------------------------------
def test_compile_watch_disabled_is_empty():
    with CompileWatch(enabled=False) as w:
        torch.ones(2) + 1
    assert w.info == {}


def test_compile_watch_counts_graph_breaks_and_recompiles():
    torch._dynamo.reset()

    def f(x):
        y = x * 2
        torch._dynamo.graph_break()
        return y + 1

    fn = torch.compile(f, backend="eager", dynamic=False)  # dynamo only: fast, no inductor
    with CompileWatch(enabled=True) as w:
        fn(torch.ones(3))
        fn(torch.ones(5))  # new static shape: recompile
    info = w.info
    assert info["graph_breaks"] >= 1
    assert info["break_reasons"] and all(isinstance(r, str) for r in info["break_reasons"])
    assert info["graph_count"] >= 2
    assert info["recompiles"] >= 1
    assert info["recompile_reasons"]
    import json

    json.dumps(info)  # JSON-safe for the result log


def test_compile_watch_never_raises_and_lets_block_errors_through(monkeypatch):
    watch = CompileWatch(enabled=True)
    with watch:
        monkeypatch.setattr(watch, "counters", lambda: 1 / 0)
    assert watch.info["errors"] and "ZeroDivisionError" in watch.info["errors"][0]
    with pytest.raises(KeyError), CompileWatch(enabled=True):
        raise KeyError("user error")


def test_explain_compile_says_why_no_faster():
    info = {"graph_count": 3, "graph_breaks": 2, "break_reasons": ["Tensor.item()"], "recompiles": 1,
            "recompile_reasons": ["size mismatch at index 0"], "fallback": ["Unsupported: custom op"]}
    text = "\n".join(explain_compile(info, speedup=0.98, device_type="cpu", num_parameters=1000, compile_s=12.0))
    assert "compiled but no faster" in text
    assert "fell back to eager" in text and "small" in text and "12.0 s" in text
    assert not any("no faster" in s for s in explain_compile(info, speedup=1.5))


# ---- analyses --------------------------------------------------------------------------------
def test_gpu_peak_table_matches_longest_name_first():
    assert gpu_peak_flops("NVIDIA H200", "bf16") == pytest.approx(989.4e12)
    assert gpu_peak_flops("NVIDIA H100 PCIe", "bf16") == pytest.approx(756e12)
    assert gpu_peak_flops("NVIDIA H100 80GB HBM3", "fp32") == pytest.approx(66.9e12)
    assert gpu_peak_flops("NVIDIA A10", "fp32") == pytest.approx(31.2e12)  # not the A100 row
    assert gpu_peak_flops("Tesla T4", "bf16") is None
    assert gpu_peak_flops("Mystery GPU", "fp32") is None
    assert compute_dtype(wb.Knobs(amp="bf16")) == "bf16"
    assert compute_dtype(wb.Knobs(matmul_precision="high")) == "tf32"


def test_thread_check_flags_oversubscription():
    over = thread_check(wb.Knobs(num_workers=2, cpu_threads=2), cores=2)
    assert over["oversubscribed"] and over["suggest_cpu_threads"] == 1
    fine = thread_check(wb.Knobs(num_workers=1, cpu_threads=1), cores=2)
    assert not fine["oversubscribed"] and fine["suggest_cpu_threads"] is None


def test_short_circuit_knobs_drop_workers():
    k = short_circuit_knobs(wb.Knobs(num_workers=2, persistent_workers=True, prefetch_factor=4))
    assert k.data == "cached" and k.num_workers == 0 and not k.persistent_workers


def test_memory_breakdown_and_block_ranking():
    bench = make_bench()
    k = bench.defaults
    mem = memory_breakdown(bench.workload, k).set_index("kind")["bytes"]
    params = sum(p.numel() * 4 for p in bench.workload.pristine.parameters())
    assert mem["parameters"] == params
    assert mem["gradients"] == params
    assert mem["optimizer state"] >= 2 * params  # AdamW: exp_avg and exp_avg_sq per parameter
    assert mem["activations at peak"] > 0
    blocks = block_activation_bytes(bench.workload, k)
    assert list(blocks.index) == ["blocks.1", "blocks.0"]  # the wide block saves more
    assert blocks["blocks.1"] > blocks["blocks.0"] > 0


def test_memory_breakdown_without_a_peak_meter_says_not_measured(monkeypatch):
    # the MPS path, exercised on CPU: with no meter the activations are <NA> with a note, never 0
    import workbench.core.measure

    monkeypatch.setattr(workbench.core.measure, "memory_meter", lambda device_type: None)
    bench = make_bench()
    df = memory_breakdown(bench.workload, bench.defaults)
    mem = df.set_index("kind")["bytes"]
    assert mem.isna()["activations at peak"] and mem.isna().sum() == 1
    params = sum(p.numel() * 4 for p in bench.workload.pristine.parameters())
    assert mem["parameters"] == params and mem["gradients"] == params  # the step still ran
    assert "not measured" in df.attrs["note"]


def test_flops_profile_and_loader_rate():
    bench = make_bench()
    k = bench.defaults
    n = flops_per_step(bench.workload, k)
    # forward+backward of the Linear layers = 3 x forward matmul FLOPs (2*B*in*out each), minus
    # the first layer's input gradient (the batch does not require grad)
    fwd = 2 * 16 * (16 * 16 + 16 * 128 + 128 * 16 + 16 * 4)
    assert n == 3 * fwd - 2 * 16 * 16 * 16
    assert flops_per_step(bench.workload, k.replace(accum_steps=2)) == 2 * n
    stages, ops = profile_step(bench.workload, k, steps=2)
    assert {"data", "forward", "backward", "optimizer"} <= set(stages["stage"])
    assert not ops.empty and ops["self_cpu_ms"].is_monotonic_decreasing
    rate = loader_rate(bench.workload, k, batches=4)
    assert rate["samples_per_s"] > 0 and rate["startup_s"] >= 0


# ---- the decision tree (synthetic trials: deterministic) ----------------------------------------
THREADS = {"cores": 2, "main_threads": 2, "workers": 0, "threads_wanted": 2, "oversubscribed": False,
           "suggest_cpu_threads": None}


def test_decide_data_bound_suggests_workers():
    base, cached = fake_result(1, 0.10, wait=0.6), fake_result(2, 0.02)
    v = decide(wb.Knobs(batch_size=16), check_data(base, cached, None), THREADS, device=torch.device("cpu"))
    assert v.bottleneck == "data"
    assert v.next_knobs["num_workers"] == 1 and v.next_knobs["cpu_threads"] == 1
    assert "Next: bench.run(num_workers=1" in str(v)


def test_decide_other_branches():
    cpu = torch.device("cpu")
    oom = fake_result(1, 0.1, status="oom")
    assert decide(wb.Knobs(), DataCheck(oom, None, None, None, None), THREADS, device=cpu).bottleneck == "memory"
    fast = check_data(fake_result(1, 0.1, wait=0.01), fake_result(2, 0.1), None)
    fb = decide(wb.Knobs(compile="default"), fast, THREADS, device=cpu, compile_info={"fallback": ["x"]})
    assert fb.bottleneck == "compile" and fb.next_knobs == {"compile": "off"}
    over = dict(THREADS, workers=2, threads_wanted=4, oversubscribed=True, suggest_cpu_threads=1)
    assert decide(wb.Knobs(num_workers=2), fast, over, device=cpu).next_knobs == {"cpu_threads": 1}
    compute = decide(wb.Knobs(amp="bf16"), fast, THREADS, device=cpu, has_conv=True)
    assert compute.bottleneck == "compute" and compute.next_knobs == {"channels_last": True}


def test_decide_names_page_faults_as_evidence_with_the_fix(monkeypatch):
    """A baseline whose kernel share passed 5% gets an evidence line naming wb.keep_freed_memory();
    the bottleneck and the next knob stay the decision tree's."""
    from dataclasses import replace

    from workbench.diagnose import verdict

    monkeypatch.setattr(verdict, "keeps_freed_memory", lambda: False)
    cpu, knobs = torch.device("cpu"), wb.Knobs(amp="bf16")
    faulting = replace(fake_result(1, 0.1, wait=0.01), extra={"kernel_share": 0.14, "page_faults_per_step": 9000.0})
    quiet = replace(faulting, extra={"kernel_share": 0.01, "page_faults_per_step": 300.0})
    v = decide(knobs, check_data(faulting, fake_result(2, 0.1), None), THREADS, device=cpu, has_conv=True)
    line = next(e for e in v.evidence if e.startswith("the kernel took"))
    assert "14%" in line and "9,000 page faults per step" in line and "wb.keep_freed_memory()" in line
    # over 10% of the CPU time: still compute (faults are the step's own CPU time), the next knob the allocator mode
    assert v.bottleneck == "compute" and set(v.next_knobs) == {"allocator"} and "page faults" in v.summary
    assert any("over 10%, the next knob is the allocator mode" in e for e in v.evidence)
    some = replace(faulting, extra={"kernel_share": 0.07, "page_faults_per_step": 9000.0})  # 5-10%: evidence only
    v = decide(knobs, check_data(some, fake_result(2, 0.1), None), THREADS, device=cpu, has_conv=True)
    assert v.bottleneck == "compute" and v.next_knobs == {"channels_last": True}
    assert any(e.startswith("the kernel took 7%") for e in v.evidence)
    calm = decide(knobs, check_data(quiet, fake_result(2, 0.1), None), THREADS, device=cpu, has_conv=True)
    assert not any("kernel took" in e for e in calm.evidence)
    monkeypatch.setattr(verdict, "keeps_freed_memory", lambda: True)  # already kept: no call to suggest
    kept = decide(knobs, check_data(some, fake_result(2, 0.1), None), THREADS, device=cpu, has_conv=True)
    assert any("kernel took" in e and "keep_freed_memory" not in e for e in kept.evidence)


def test_allocator_fix_cites_the_modes_measured_here():
    from dataclasses import replace

    from workbench.diagnose.verdict import allocator_fix

    k = wb.Knobs(batch_size=16)
    glibc = replace(fake_result(1, 0.1), env={"allocator": "glibc"})
    assert allocator_fix([glibc], k) is None  # one mode: nothing measured to cite
    tc = replace(fake_result(2, 0.08), knobs=k.replace(allocator="tcmalloc"), env={"allocator": "tcmalloc"})
    text = allocator_fix([glibc, tc], k)
    assert text.startswith("measured here: allocator 'tcmalloc' 1.25x over 'glibc'") and "#2, #1" in text


def test_verdict_cites_the_phase_split():
    import pandas as pd

    fast = check_data(fake_result(1, 0.1, wait=0.01), fake_result(2, 0.1), None)
    stages = pd.DataFrame({"stage": ["data", "forward", "backward", "optimizer"], "ms_per_step": [1.0, 3.0, 5.0, 1.0]})
    stages["share"] = stages["ms_per_step"] / 10
    from workbench.diagnose.verdict import cite_phases

    plain = decide(wb.Knobs(amp="bf16"), fast, THREADS, device=torch.device("cpu"))
    v = cite_phases(plain, stages)
    assert v.evidence[:-1] == plain.evidence and cite_phases(plain, None) == plain
    assert "the profiled step splits into data 10%, forward 30%, backward 50%, optimizer 10%" in str(v)


def test_data_bound_needs_wait_or_a_cached_speedup_confirmed_in_rounds():
    import dataclasses

    from workbench.deciding.rounds import compare

    cpu = torch.device("cpu")
    base = fake_result(1, 0.0137, wait=0.04)
    cached = fake_result(2, 0.0100, knobs=wb.Knobs(batch_size=16, data="cached"))
    one_pair = check_data(base, cached, None)  # 1.37x from one pair of trials, 4% data wait
    assert not one_pair.data_bound
    assert decide(wb.Knobs(batch_size=16), one_pair, THREADS, device=cpu).bottleneck != "data"
    reps = [fake_result(i, 0.0137 * (1 + 0.01 * (i % 2)), wait=0.04) for i in (3, 5)]
    creps = [fake_result(i, 0.0100 * (1 + 0.01 * (i % 2)), knobs=cached.knobs) for i in (4, 6)]
    rounds = compare([base, *reps], [cached, *creps])
    rounds = dataclasses.replace(rounds, rounds=2)  # as bench.compare(..., rounds=2) reports it
    confirmed = check_data(base, cached, None, rounds)
    assert confirmed.data_bound and "2 alternating rounds" in str(decide(wb.Knobs(batch_size=16), confirmed,
                                                                          THREADS, device=cpu))
    assert check_data(fake_result(1, 0.01, wait=0.20), None, None).data_bound  # the 20% rule alone


# ---- end to end --------------------------------------------------------------------------------
def test_diagnose_data_bound_end_to_end():
    bench = make_bench(SlowData())
    d = bench.diagnose()
    assert isinstance(d, Diagnosis)
    assert d.bottleneck == "data"  # 4 ms per sample vs a sub-millisecond step
    assert d.next_knobs.get("num_workers", 0) >= 1
    df = bench.results
    assert len(df) == 2 and (df["data"] == "cached").sum() == 1 and (df["status"] == "ok").all()
    text = str(d)
    for section in ("Bottleneck: data", "Data pipeline", "Time by stage", "Memory at the peak", "FLOPs and MFU"):
        assert section in text
    page = d._repr_html_()
    assert "<table" in page and "Diagnosis" in page
    assert d.mfu is not None and d.mfu > 0
    assert d.problems == []
    # the profiler's steps are kept as a Chrome trace (a temp file: this bench has no log)
    trace = json.loads(open(d.trace_path).read())
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"data", "forward", "backward", "optimizer", "ProfilerStep#1"} <= names
    assert d.trace_path in text
    before = len(bench.trials)
    bench.diagnose(profile=False, memory=False, flops=False, loader=False)
    assert len(bench.trials) == before  # ok trials with the same knobs are reused


def test_diagnose_on_a_failing_baseline_reports_instead_of_crashing():
    def step_fn(model, batch):
        x, y = batch
        if len(x) == 8:
            raise RuntimeError("batch of 8 breaks this step")
        return nn.functional.cross_entropy(model(x), y)

    data = TensorDataset(torch.randn(64, 16), torch.randint(0, 4, (64,)))
    bench = wb.Workbench(Blocks(), data, step_fn=step_fn, log=None, steps=3, warmup_steps=1,
                         knobs=wb.Knobs(batch_size=16))
    d = bench.diagnose(knobs=bench.knobs(batch_size=8))
    assert d.bottleneck == "failed" and "batch of 8" in str(d)
    assert len(bench.trials) == 1  # no short-circuit trial after a failure
    with pytest.raises(TypeError):
        bench.diagnose(knobs={"batch_size": 4})


def test_diagnose_reads_steady_trials_only():
    """A trial that was not steady (steady.py) is neither reused nor judged: it runs once more."""
    from workbench.diagnose.report import _find, _steady_run

    class Stub:
        def __init__(self):
            self.trials = []

        def run(self, knobs):
            r = TrialResult(knobs=knobs, status="ok", samples_per_s=1.0, extra={"steady": bool(self.trials)})
            self.trials.append(r)
            return r

    bench = Stub()
    k = wb.Knobs()
    r = _steady_run(bench, k)
    assert r.steady is True and len(bench.trials) == 2
    bench.trials = bench.trials[:1]  # only the unsteady one
    assert _find(bench, k) is None


# ---- a new analysis is one new file in diagnose/ ---------------------------------------------
NEW_ANALYSIS = '''"""A user's analysis, one file: the parameter count (written by the test, removed after)."""
import pandas as pd

from .analysis import Context, analysis

FAIL = False  # the test sets it to see a failure listed in problems


@analysis("parameter census", title="Parameter census (a new file)", steps=1.0, order=5)
def census(ctx: Context) -> pd.DataFrame:
    if FAIL:
        raise RuntimeError("the census refuses")
    n = ctx.workload.num_parameters
    return pd.DataFrame({"figure": ["parameters", "trial"], "value": [n, ctx.base.trial_id]})
'''


@pytest.fixture
def new_analysis_file():
    """A module written into workbench/diagnose/ as a user would add one (no other file edited)."""
    import workbench.diagnose as pkg
    from workbench.diagnose.analysis import ANALYSES

    name = f"zz_census_{os.getpid()}"
    path = Path(pkg.__file__).parent / f"{name}.py"
    path.write_text(NEW_ANALYSIS)
    try:
        yield f"workbench.diagnose.{name}"
    finally:
        path.unlink(missing_ok=True)
        ANALYSES.pop("parameter census", None)
        sys.modules.pop(f"workbench.diagnose.{name}", None)


def test_a_new_analysis_is_one_file_that_diagnose_runs_budgets_and_shows(new_analysis_file):
    bench = make_bench()
    d = bench.diagnose(profile=False, loader=False, budget_s=600, progress=False)
    n = sum(p.numel() for p in Blocks().parameters())
    assert d.analyses["parameter census"]["value"].tolist() == [n, bench.trials[0].trial_id]
    text, page = str(d), d._repr_html_()
    assert "== Parameter census (a new file) ==" in text and re.search(rf"parameters\s+{n}\n", text)
    assert text.index("Parameter census") < text.index("Memory at the peak") < text.index("FLOPs and MFU")
    assert "<b>Parameter census (a new file)</b>" in page and f"<td>{n}</td>" in page
    assert "parameter census" in d.spent.seconds and "parameter census" in text.split("== Budget")[1]  # its seconds
    assert d.problems == [] and d.memory is not None and d.flops is not None  # the built-ins, declared the same way

    sys.modules[new_analysis_file].FAIL = True  # one that raises is listed; the rest still run
    d = bench.diagnose(profile=False, loader=False, progress=False)
    assert d.problems == ["parameter census: RuntimeError: the census refuses"]
    assert "Parameter census" not in str(d) and d.memory is not None and "Memory at the peak" in str(d)

    d = bench.diagnose(profile=False, skip=["parameter census", "FLOP count", "loader rate"], progress=False)
    assert "parameter census" not in d.analyses and d.flops is None and d.memory is not None and d.problems == []
    assert d.data.loader_samples_per_s is None and "loader rate" not in d.spent.seconds
    assert "Parameter census" not in str(d) and "FLOPs and MFU" not in str(d)
    with pytest.raises(ValueError, match="parameter census"):  # the message lists the known names
        bench.diagnose(skip="census", progress=False)
