"""run_trial: same start for every trial, honest counting, and failure as a result."""

import math
import os
import signal
import threading
import typing

import psutil
import pytest
import torch
from conftest import SquareDataset, TinyNet, tiny_data

import workbench as wb
from workbench.launch.runner import TrialInterrupted


@pytest.mark.fixed_warmup
def test_identical_trials_give_bit_identical_losses(make_bench):
    bench = make_bench()
    a, b = bench.run(), bench.run()
    assert a.ok and b.ok
    assert a.losses == b.losses and len(a.losses) == 3


@pytest.mark.fixed_warmup
def test_user_model_is_never_mutated(make_bench):
    class WithBN(TinyNet):
        def __init__(self):
            super().__init__()
            self.bn = torch.nn.BatchNorm1d(4)

        def forward(self, x):
            return self.bn(super().forward(x))

    model = WithBN()
    before = {k: v.clone() for k, v in model.state_dict().items()}
    bench = make_bench(model=model)
    bench.run()
    bench.run(amp="bf16", checkpoint=["blocks.0"])
    after = model.state_dict()
    assert all(torch.equal(before[k], after[k]) for k in before)
    assert model.training and all(p.grad is None for p in model.parameters())
    # later edits to the user's model do not leak into trials either (snapshot at construction)
    first = bench.trials[0].losses
    with torch.no_grad():
        model.head.weight.add_(1.0)
    assert bench.run().losses == first


def test_accumulation_counts_samples(make_bench):
    r = make_bench().run(batch_size=4, accum_steps=3)
    assert r.samples_per_step == 12
    assert r.samples_per_s == pytest.approx(12 * 3 / r.extra["wall_s"])
    assert len(r.step_times_s) == 3 and len(r.data_wait_s) == 3


def test_loader_cycles_over_epochs(make_bench):
    bench = make_bench(data=tiny_data(16), steps=6)
    r = bench.run(batch_size=8)  # 2 batches per epoch, 1 + 6 steps
    assert r.ok and r.extra["epochs"] >= 2


def test_rng_state_of_the_caller_is_restored(make_bench):
    bench = make_bench()
    torch.manual_seed(123)
    expected = torch.rand(1)
    torch.manual_seed(123)
    bench.run()
    assert torch.equal(torch.rand(1), expected)


def test_cached_data_short_circuits_the_loader(make_bench):
    r = make_bench(data=SquareDataset()).run(data="cached")
    assert r.ok and r.data_wait_share < 0.05


class Counting(torch.nn.Linear):
    """A block that counts its forward runs in a class-level dict (shared by deep copies)."""

    runs: typing.ClassVar[dict] = {}

    def __init__(self, name: str):
        super().__init__(16, 16)
        self.name = name

    def forward(self, x):
        Counting.runs[self.name] = Counting.runs.get(self.name, 0) + 1
        return super().forward(x)


def test_checkpoint_wraps_exactly_the_named_blocks(make_bench):
    model = TinyNet()
    model.blocks = torch.nn.ModuleList([Counting("blocks.0"), Counting("blocks.1")])
    bench = make_bench(model=model, steps=2, warmup_steps=0)
    Counting.runs.clear()
    bench.run(checkpoint=["blocks.1"])
    assert Counting.runs == {"blocks.0": 2, "blocks.1": 4}  # 2 steps; blocks.1 recomputed in backward


def test_unknown_block_lists_the_candidates(make_bench):
    with pytest.raises(ValueError, match=r"blocks\.0, blocks\.1"):
        make_bench().run(checkpoint=["encoder.3"])


def test_batch_larger_than_dataset(make_bench):
    with pytest.raises(ValueError, match="lower batch_size to at most 64"):
        make_bench().run(batch_size=65)


def test_notes_say_no_ops(make_bench):
    r = make_bench().run(pin_memory=True)
    assert any("pin_memory is a no-op" in n for n in r.notes)


class Faulty(TinyNet):
    """Raises (or returns NaN) at the n-th forward call of the trial's copy."""

    def __init__(self, kind: str, at: int = 2):
        super().__init__()
        self.kind, self.at, self.calls = kind, at, 0

    def forward(self, x):
        self.calls += 1
        if self.calls >= self.at:
            if self.kind == "oom":
                raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
            if self.kind == "cpu-oom":
                raise RuntimeError("[enforce fail at alloc_cpu.cpp:117] DefaultCPUAllocator: can't allocate memory")
            if self.kind == "error":
                raise IndexError("index 9 is out of bounds")
            if self.kind == "nan":
                return super().forward(x) * float("nan")
        return super().forward(x)


@pytest.mark.parametrize("kind, status, words", [
    ("oom", "oom", "out of memory in the model's forward"),
    ("cpu-oom", "oom", "amp='bf16'"),
    ("error", "error", "IndexError in the model's forward"),
    ("nan", "nan", "loss became nan"),
])
def test_failures_are_results_and_the_next_trial_works(make_bench, kind, status, words):
    model = Faulty(kind)
    bench = make_bench(model=model)
    model.calls = -10**6  # the probe at construction must pass; trials copy the snapshot below
    bench.workload.pristine.calls = 0
    r = bench.run()
    assert r.status == status and words in r.message
    assert bench.results["status"].tolist() == [status]
    bench.workload.pristine.at = 10**9  # heal the workload: the next trial succeeds
    assert bench.run().ok
    assert len(bench.results) == 2


def test_exception_in_dataset_main_process_and_worker(make_bench):
    class BadData(SquareDataset):
        def __getitem__(self, i):
            if i == 5:
                raise KeyError("sample 5 is corrupt")
            return super().__getitem__(i)

    bench = make_bench(data=BadData(), knobs=wb.Knobs(batch_size=8))
    bench.workload.spec.shuffle = False  # the probe batch (0..7) passes; make order deterministic
    for workers in (0, 2):
        r = bench.run(num_workers=workers)
        assert r.status == "error" and r.where == "data", r.message
        assert "data pipeline" in r.message and "corrupt" in (r.message + r.traceback)
    assert psutil.Process().children() == []


def test_error_in_step_fn_is_attributed(make_bench):
    state = {"n": 0}

    def step(model, batch):
        state["n"] += 1
        if state["n"] > 1:
            raise ValueError("bad step")
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    r = make_bench(step_fn=step).run()
    assert r.status == "error" and r.where == "step_fn" and "in step_fn" in r.message


def counting_step(after: int, action):
    """A step_fn that calls `action()` once it has run `after` times (on the trial thread)."""
    calls = [0]

    def step_fn(model, batch):
        calls[0] += 1
        if calls[0] == after:
            action()
        x, y = batch
        return torch.nn.functional.cross_entropy(model(x), y)

    return step_fn


@pytest.mark.fixed_warmup
def test_cancel_event_stops_at_a_step_boundary(make_bench):
    cancel = threading.Event()
    bench = make_bench(steps=50, step_fn=counting_step(4, cancel.set))
    r = bench.run(cancel=cancel)
    assert r.status == "interrupted" and "stopped by the user" in r.message
    # calls: the construction probe, 1 warm-up step, measured steps 1 and 2: stops after step 2
    assert "measured step 2" in r.message
    cancel.clear()
    assert bench.run().ok


def test_keyboard_interrupt_is_recorded_then_reraised(make_bench):
    def interrupt():
        raise KeyboardInterrupt

    bench = make_bench(steps=50, step_fn=counting_step(3, interrupt))
    with pytest.raises(KeyboardInterrupt) as info:
        bench.run()
    assert isinstance(info.value, TrialInterrupted)
    assert bench.trials[-1].status == "interrupted" and info.value.result.trial_id == 1
    assert bench.run().ok


def test_progress_callback_is_polled_from_its_own_thread(make_bench):
    """The measured loop never calls UI code: a progress callable runs on a Poller's thread."""
    seen = []
    bench = make_bench(steps=3)
    bench.run(progress=lambda phase, done, total: seen.append((threading.current_thread().name, phase, done)))
    assert seen and not any(name.startswith("workbench-trial") for name, _, _ in seen)
    assert seen[-1][1:] == ("done", 4)


def test_no_worker_processes_survive_trials(make_bench):
    bench = make_bench(data=SquareDataset(), steps=3)
    bench.run(num_workers=2)
    bench.run(num_workers=2, persistent_workers=True, prefetch_factor=4)
    assert psutil.Process().children(recursive=True) == []


def test_killed_worker_is_an_error_not_a_hang(make_bench):
    class Suicidal(SquareDataset):
        def __getitem__(self, i):
            import torch.utils.data as tud

            if tud.get_worker_info() is not None and i >= 16:
                os.kill(os.getpid(), signal.SIGKILL)
            return super().__getitem__(i)

    bench = make_bench(data=Suicidal(), steps=6)
    bench.workload.spec.shuffle = False
    r = bench.run(num_workers=1)
    assert r.status == "error" and r.where == "data"
    assert psutil.Process().children(recursive=True) == []
    assert bench.run().ok


def test_checkpointing_lowers_measured_peak_memory(make_bench):
    class Wide(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = torch.nn.Linear(8, 64)
            self.blocks = torch.nn.ModuleList(
                torch.nn.Sequential(torch.nn.Linear(64, 1024), torch.nn.GELU(), torch.nn.Linear(1024, 64))
                for _ in range(6)
            )
            self.head = torch.nn.Linear(64, 4)

        def forward(self, x):
            h = self.inp(x)
            for b in self.blocks:
                h = h + b(h)
            return self.head(h)

    bench = make_bench(model=Wide(), data=tiny_data(512), knobs=wb.Knobs(batch_size=512), steps=2)
    plain = bench.run()
    ckpt = bench.run(checkpoint=bench.blocks)
    assert plain.peak_memory_bytes > 2.5 * ckpt.peak_memory_bytes


def test_fp16_on_cpu_runs_and_warns(make_bench):
    with pytest.warns(UserWarning, match="can be slower than fp32") as caught:
        r = make_bench().run(amp="fp16")
    assert r.ok, f"{r.status}: {r.message}"  # a small MLP's loss stays finite in fp16: nan would be a bug
    assert r.losses and all(math.isfinite(x) for x in r.losses) and any("fp16" in n for n in r.notes)
    assert [w.filename for w in caught if "fp16" in str(w.message)] == [__file__]  # once, at the user's call


@pytest.mark.slow
def test_compiled_trial_reports_compile_time_and_graphs(make_bench):
    r = make_bench(steps=3, warmup_steps=2).run(compile="default")
    assert r.ok, r.message
    info = r.extra["compile"]
    assert info["graph_count"] >= 1 and "graph_breaks" in info
    assert r.compile_s > 0


@pytest.mark.fixed_warmup  # the interrupt is counted in steps: it must land in the measured window
def test_ctrl_c_in_the_calling_thread_stops_the_trial_and_records_it(make_bench):
    bench = make_bench(steps=10**6)
    # a shell's background job inherits SIGINT ignored; a kernel (and this test) wants Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    timer = threading.Timer(1.5, lambda: os.kill(os.getpid(), signal.SIGINT))
    timer.start()
    try:
        with pytest.raises(KeyboardInterrupt) as info:
            bench.run()
    finally:
        signal.signal(signal.SIGINT, previous)
    assert isinstance(info.value, TrialInterrupted)
    assert bench.trials[-1].status == "interrupted" and "by the user at measured step" in bench.trials[-1].message
    bench.steps = 3
    assert bench.run(batch_size=4).ok  # the trial thread is free again


def _step_threads(bench) -> list[str]:
    """Spy on the step: the names of the threads that ran it."""
    names: list[str] = []
    original = bench.workload.step_fn
    bench.workload.step_fn = lambda m, b: (names.append(threading.current_thread().name), original(m, b))[1]
    return names


def test_a_trial_from_the_main_thread_runs_on_it_like_the_users_loop(make_bench):
    """Issue 23: the thread decides the malloc arena and the OpenMP pool, so a cell's trial runs inline."""
    bench = make_bench(step_fn=counting_step(10**9, None))
    names = _step_threads(bench)
    assert threading.current_thread() is threading.main_thread()
    assert bench.run().ok
    assert names and set(names) == {threading.main_thread().name}


def test_trials_from_other_threads_run_on_one_dedicated_thread(make_bench):
    """The panel's worker (any non-main caller) hands its trials to the one trial thread."""
    bench = make_bench(step_fn=counting_step(10**9, None))
    names = _step_threads(bench)
    results = []
    for _ in range(2):
        caller = threading.Thread(target=lambda: results.append(bench.run()), name="panel-worker")
        caller.start()
        caller.join()
    assert [r.ok for r in results] == [True, True]
    assert set(names) == {names[0]} and names[0].startswith("workbench-trial")


def test_an_inline_trial_failure_is_a_result_and_interrupts_propagate(make_bench):
    """submit_trial on the main thread: a failing trial is a done Future; Ctrl-C outside a trial propagates."""
    from workbench.launch.runner import submit_trial

    def boom():
        raise RuntimeError("user code")

    future = submit_trial(boom)
    assert future.done() and isinstance(future.exception(), RuntimeError)

    def interrupt():
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        submit_trial(interrupt)


def test_derive_is_a_pure_function_of_the_raw_samples():
    from workbench.core.phases import RawTrial, derive

    raw = RawTrial(warmup_steps=2, steps=4, startup_s=0.5, warm_times_s=[1.0, 0.2], warmup_wall_s=1.2, probe_s=0.0,
                   step_times_s=[0.1, 0.1, 0.1, 0.3], waits_s=[0.05, 0.0, 0.0, 0.0], losses=[2.0, 1.5, float("nan"), 1.0],
                   samples=32, wall_s=0.6, epochs=1, foreign_cores=0.9, peak_bytes=1000)
    knobs = wb.Knobs(batch_size=8, num_workers=1)
    fields, notes = derive(raw, knobs)
    assert derive(raw, knobs) == (fields, notes)  # same input, same output
    assert fields["status"] == "nan" and "measured step 3" in fields["message"]
    assert fields["samples_per_s"] == pytest.approx(32 / 0.6) and fields["samples_per_step"] == 8
    assert fields["step_time_s"] == pytest.approx(0.1) and fields["compile_s"] is None  # nothing compiled
    compiled, _ = derive(raw, wb.Knobs(batch_size=8, num_workers=1, compile="default"))
    assert compiled["compile_s"] == pytest.approx(1.2 - 0.2)
    assert fields["data_wait_share"] == pytest.approx(0.05 / 0.6)
    assert any(n.startswith("disturbed") for n in notes) and any("re-forked" in n for n in notes)
    assert any(n.startswith("noisy") for n in notes)


def test_derive_notes_page_faults_only_when_the_kernel_took_a_real_share(monkeypatch):
    """Kernel time above 5% of the window's CPU time, with page faults, is named with the fix
    (wb.keep_freed_memory() or glibc's environment variables; once malloc keeps freed memory, what
    is left: blocks above 32 MiB); with workers the note names shared memory instead; quiet windows get none."""
    from workbench.core import phases
    from workbench.core.phases import MALLOC_ENV, RawTrial, derive

    monkeypatch.setattr(phases, "keeps_freed_memory", lambda: False)
    monkeypatch.setattr(phases, "malloc_settled", lambda: False)

    def raw(share: float, faults: int) -> RawTrial:
        return RawTrial(warmup_steps=1, steps=10, startup_s=0.1, warm_times_s=[0.1], warmup_wall_s=0.1, probe_s=0.0,
                        step_times_s=[0.1] * 10, waits_s=[0.0] * 10, losses=[1.0] * 10, samples=80, wall_s=1.0,
                        epochs=0, foreign_cores=0.0, peak_bytes=None, page_faults=faults, kernel_share=share)

    fields, notes = derive(raw(0.19, 230_000), wb.Knobs(batch_size=8))
    note = next(n for n in notes if n.startswith("page faults"))
    assert "19%" in note and "23,000 page faults per step" in note and MALLOC_ENV in note
    assert "wb.keep_freed_memory()" in note
    assert fields["extra"]["page_faults_per_step"] == 23_000 and fields["extra"]["kernel_share"] == 0.19
    monkeypatch.setattr(phases, "keeps_freed_memory", lambda: True)  # already kept: the fix is elsewhere
    note = next(n for n in derive(raw(0.19, 230_000), wb.Knobs(batch_size=8))[1] if n.startswith("page faults"))
    assert "32 MiB" in note and "allocator='tcmalloc'" in note and "keep_freed_memory()" not in note
    monkeypatch.setattr(phases, "keeps_freed_memory", lambda: False)
    monkeypatch.setattr(phases, "malloc_settled", lambda: True)  # glibc at its ceilings: what is above them
    note = next(n for n in derive(raw(0.19, 230_000), wb.Knobs(batch_size=8))[1] if n.startswith("page faults"))
    assert "above 32 MiB" in note and "64 MiB" in note and "allocator='glibc-kept'" in note
    assert "keep_freed_memory()" not in note
    monkeypatch.setattr(phases, "malloc_settled", lambda: False)
    _, notes = derive(raw(0.19, 230_000), wb.Knobs(batch_size=8, num_workers=2))
    assert any(n.startswith("page faults") and "shared memory" in n and MALLOC_ENV not in n for n in notes)
    for share, faults in ((0.01, 230_000), (0.19, 0)):  # a quiet window; kernel time without faults
        _, notes = derive(raw(share, faults), wb.Knobs(batch_size=8))
        assert not any(n.startswith("page faults") for n in notes)
    _, notes = derive(RawTrial(**{**raw(0.19, 1).__dict__, "page_faults": None, "kernel_share": None}),
                      wb.Knobs(batch_size=8))  # unreadable (Windows): no note, no error
    assert not any(n.startswith("page faults") for n in notes)


def test_a_trial_counts_the_page_faults_of_its_window(make_bench):
    """A model that takes 64 MiB of fresh memory every step (above glibc's 32 MiB mmap ceiling, so it
    is mapped and unmapped each time): every step faults its 16,384 pages in, and the trial says so."""
    from conftest import TinyNet

    class Faulting(TinyNet):
        def forward(self, x):
            scratch = torch.ones(16 * 2**20)  # 64 MiB of float32, written: every page faulted in
            return super().forward(x) + scratch[0] * 0

    quiet = make_bench().run(progress=False)
    assert quiet.ok and quiet.extra["page_faults_per_step"] >= 0 and 0 <= quiet.extra["kernel_share"] <= 1
    r = make_bench(Faulting()).run(progress=False)
    assert r.ok and r.extra["page_faults_per_step"] >= 8192  # half the pages: room for huge pages
    assert any(n.startswith("page faults") for n in r.notes), r.notes


@pytest.mark.parametrize("exc, hinted", [
    (RuntimeError("rank 1 only"), False),
    (ValueError("my own check failed"), False),
    (RuntimeError("mat1 and mat2 shapes cannot be multiplied (8x4 and 5x2)"), True),
    (RuntimeError("expected scalar type Float but found Half"), True),
])
def test_shape_hint_only_for_shape_and_dtype_errors(exc, hinted):
    from workbench.core.phases import failure_message
    from workbench.core.step import Stage

    stage = Stage()
    stage.name, stage.phase, stage.step = "model", "measured", 2
    message = failure_message("error", exc, stage, wb.Knobs())
    assert str(exc) in message and "in the model's forward at measured step 2" in message
    assert ("shapes and dtypes" in message) is hinted, message
