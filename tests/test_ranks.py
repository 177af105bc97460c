"""Distributed trials (workbench/launch/ranks.py, join.py, worker.py): 2 gloo ranks forked from this process.

The multi-process tests are `slow` and tiny (a 2-layer MLP, a few steps, short timeouts) so the
whole file stays within about a minute on a 2-core machine.
"""

from __future__ import annotations

import math
import os
import signal
import time

import psutil
import pytest
import torch
from rank_failures import job_output, why
from torch import nn

import workbench as wb
from workbench.core.knobs import Knobs, device_notes
from workbench.faces.charts import scaling_chart

# What a rank should do wrong, read by the model's forward in the forked ranks (fork copies it).
FAULT: dict = {"kind": None, "rank": 1, "at": 4}


class FaultyMLP(nn.Module):
    """A small MLP that misbehaves on one rank at one forward call, as FAULT says."""

    def __init__(self) -> None:
        super().__init__()
        self.net = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4))
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.calls += 1
        kind = FAULT["kind"]
        if kind and torch.distributed.is_initialized() and FAULT["rank"] in (torch.distributed.get_rank(), "all") \
                and self.calls == FAULT["at"]:
            if kind == "raise":
                raise RuntimeError("planted failure")
            if kind == "oom":
                raise torch.OutOfMemoryError("planted: CUDA out of memory")
            if kind == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            if kind == "hang":
                time.sleep(600)
            if kind == "nan":
                return self.net(x) * float("nan")
        return self.net(x)


def make_bench(tmp_path, **kwargs) -> wb.Workbench:
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))
    defaults = dict(loss_fn=nn.CrossEntropyLoss(), optimizer=lambda p: torch.optim.SGD(p, lr=0.05), device="cpu",
                    log=tmp_path / "log.jsonl", steps=6, warmup_steps=2, knobs=Knobs(batch_size=8),
                    collective_timeout_s=5.0)
    return wb.Workbench(FaultyMLP(), ds, **{**defaults, **kwargs})


def no_children() -> bool:
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        if not psutil.Process().children(recursive=True):
            return True
        time.sleep(0.1)
    return False


# ---- knobs (fast) --------------------------------------------------------------------------------
def test_ddp_knobs_validate_with_the_fix() -> None:
    with pytest.raises(ValueError, match="world_size=0 is too small: set it to an int >= 1"):
        Knobs(world_size=0)
    with pytest.raises(ValueError, match="ddp_comm_hook"):
        Knobs(ddp_comm_hook="int8")
    with pytest.raises(ValueError, match="ddp_bucket_cap_mb=0 is too small"):
        Knobs(ddp_bucket_cap_mb=0)
    with pytest.raises(TypeError, match="ddp_bucket_cap_mb takes an int"):
        Knobs(ddp_bucket_cap_mb=0.5)
    with pytest.raises(TypeError, match="ddp_static_graph takes True or False"):
        Knobs(ddp_static_graph=1)
    with pytest.raises(ValueError, match="set ddp_static_graph=False or ddp_no_sync=False"):
        Knobs(world_size=2, accum_steps=2, ddp_no_sync=True, ddp_static_graph=True)
    Knobs(world_size=2, accum_steps=1, ddp_no_sync=True, ddp_static_graph=True)  # no skipped all-reduce: fine


def test_ddp_knobs_at_world_size_1_are_a_note_not_an_error() -> None:
    notes = device_notes(Knobs(ddp_bucket_cap_mb=5, ddp_no_sync=True), "cpu")
    assert "ddp_bucket_cap_mb is a no-op with world_size=1 (one process runs without DDP)" in notes
    assert "ddp_no_sync is a no-op with world_size=1 (one process runs without DDP)" in notes
    assert not any("world_size=1" in n for n in device_notes(Knobs(world_size=2, ddp_bucket_cap_mb=5), "cpu"))
    notes = device_notes(Knobs(world_size=2, ddp_no_sync=True), "cpu")
    assert any("ddp_no_sync is a no-op with accum_steps=1" in n for n in notes)


class Stream(torch.utils.data.IterableDataset):
    def __iter__(self):
        g = torch.Generator().manual_seed(0)
        while True:
            yield torch.randn(16, generator=g), torch.randint(0, 4, (), generator=g)


def test_unlaunchable_world_size_is_refused_before_any_work(tmp_path) -> None:
    bench = wb.Workbench(FaultyMLP(), Stream(), loss_fn=nn.CrossEntropyLoss(), device="cpu", log=None,
                         knobs=Knobs(batch_size=8))
    with pytest.raises(ValueError, match="map-style dataset"):
        bench.run(world_size=2)
    assert not bench.trials


# ---- 2 ranks ---------------------------------------------------------------------------------------
@pytest.mark.slow
def test_two_ranks_report_global_throughput_per_rank_times_and_comm(tmp_path) -> None:
    FAULT["kind"] = None
    bench = make_bench(tmp_path)
    r = bench.run(world_size=2, accum_steps=2)
    assert r.ok, why(r)
    d = r.extra["distributed"]
    assert r.samples_per_step == 8 * 2 * 2 == d["global_batch"]  # batch x world_size x accum
    assert d["world_size"] == 2 and d["backend"] == "gloo" and len(d["per_rank"]) == 2
    assert r.samples_per_s == pytest.approx(2 * d["per_rank_samples_per_s"])
    assert sum(p["samples_per_s"] for p in d["per_rank"]) >= r.samples_per_s * 0.99  # each rank's own window
    for p in d["per_rank"]:
        assert len(p["step_times_s"]) == 6 and len(p["data_wait_s"]) == 6 and p["threads"] == 1
        assert p["allreduce_calls"] == 6 * 2  # one bucket per micro-batch without no_sync
    assert 0.0 <= d["exposed_comm_share"] <= 1.0 and d["slowest_rank"] in (0, 1)
    assert len(r.step_times_s) == 6 and all(t > 0 for t in r.step_times_s)
    # ranks started from the same snapshot and read different shards: losses are finite means
    assert r.losses and all(math.isfinite(x) for x in r.losses), r.losses
    # the log holds it like any trial, and the user's model was never touched
    assert wb.Workbench(FaultyMLP(), bench.workload.spec.dataset, log=tmp_path / "log.jsonl", device="cpu",
                        loss_fn=nn.CrossEntropyLoss()).trials[-1].knobs.world_size == 2
    assert no_children()


@pytest.mark.slow
def test_no_sync_removes_the_all_reduces_of_non_final_micro_batches(tmp_path) -> None:
    FAULT["kind"] = None
    bench = make_bench(tmp_path)
    synced = bench.run(world_size=2, accum_steps=3)
    skipped = bench.run(world_size=2, accum_steps=3, ddp_no_sync=True)
    assert synced.ok and skipped.ok, why(synced, skipped)
    # counted by the communication hook DDP calls for every bucket it all-reduces (one bucket here)
    assert synced.extra["distributed"]["allreduce_calls"] == 6 * 3
    assert skipped.extra["distributed"]["allreduce_calls"] == 6 * 1
    with pytest.raises(ValueError, match="use ddp_comm_hook='fp16' on CPU"):
        bench.run(world_size=2, ddp_comm_hook="bf16")
    half = bench.run(world_size=2, ddp_comm_hook="fp16")
    assert half.ok, why(half)  # fp16 compression: 2 bytes per gradient element on the wire
    assert half.extra["distributed"]["per_rank"][0]["allreduce_bytes"] == 6 * (16 * 32 + 32 + 32 * 4 + 4) * 2


@pytest.mark.slow
def test_a_smaller_bucket_cap_means_more_all_reduces(tmp_path) -> None:
    # DDP's first bucket holds up to 1 MB whatever the cap, so the model needs more than that
    wide = nn.Sequential(nn.Linear(16, 256), *[nn.Linear(256, 256) for _ in range(9)], nn.Linear(256, 4))  # 2.4 MB
    bench = make_bench(tmp_path, steps=3, warmup_steps=1)
    bench = wb.Workbench(wide, bench.workload.spec.dataset, loss_fn=nn.CrossEntropyLoss(), device="cpu", log=None,
                         steps=3, warmup_steps=1, knobs=Knobs(batch_size=8))
    default = bench.run(world_size=2)
    small = bench.run(world_size=2, ddp_bucket_cap_mb=1)
    assert default.ok and small.ok, why(default, small)
    assert small.extra["distributed"]["allreduce_calls"] > default.extra["distributed"]["allreduce_calls"] >= 3


@pytest.mark.slow
@pytest.mark.fixed_warmup  # the fault is planted at a forward call inside the window
@pytest.mark.parametrize("kind, status, words", [
    ("raise", "error", ["rank 1: RuntimeError in the model's forward at measured step", "planted failure"]),
    ("oom", "oom", ["rank 1: out of memory in the model's forward"]),
    ("kill", "error", ["rank 1 was killed by SIGKILL", "in the model's forward"]),
    ("hang", "error", ["rank 1 was in the model's forward", "did not answer"]),
    ("nan", "nan", ["rank 1: loss became nan"]),
])
def test_a_failure_on_one_rank_ends_the_trial_on_all_ranks(tmp_path, kind, status, words) -> None:
    FAULT.update(kind=kind, at=2 * 2 + 2)  # past warm-up (2 steps x accum 2), inside the measured window
    bench = make_bench(tmp_path, knobs=Knobs(batch_size=8, accum_steps=2))
    t0 = time.monotonic()
    try:
        r = bench.run(world_size=2)
    finally:
        FAULT["kind"] = None
    assert r.status == status, why(r)
    for w in words:
        assert w in r.message, r.message
    assert time.monotonic() - t0 < 30  # bounded: the collective timeout is 5 s here
    assert no_children()
    nxt = bench.run(world_size=2)
    assert nxt.ok, why(nxt)
    assert [t.trial_id for t in bench.trials] == [1, 2]


@pytest.mark.slow
def test_stop_ends_every_rank(tmp_path) -> None:
    import threading

    FAULT.update(kind="hang", at=3)
    bench = make_bench(tmp_path, collective_timeout_s=60.0)
    stop = threading.Event()
    threading.Timer(3.0, stop.set).start()
    t0 = time.monotonic()
    try:
        r = bench.run(world_size=2, cancel=stop)
    finally:
        FAULT["kind"] = None
    assert r.status == "interrupted" and "stopped by the user" in r.message and "all 2 ranks ended" in r.message
    assert time.monotonic() - t0 < 15
    assert no_children()


@pytest.mark.slow
def test_scaling_table_and_chart(tmp_path) -> None:
    FAULT["kind"] = None
    bench = make_bench(tmp_path)
    result = bench.scaling(world_sizes=(2, 1), batch_size=8)
    df = result.frame
    assert list(df["world_size"]) == [1, 2]
    assert {"world_size", "samples_per_s", "per_rank_samples_per_s", "efficiency"} <= set(df.columns)
    assert (df["status"] == "ok").all()
    one, two = df.iloc[0], df.iloc[1]
    assert one["efficiency"] == pytest.approx(1.0)
    assert two["efficiency"] == pytest.approx(two["samples_per_s"] / (2 * one["samples_per_s"]))
    assert two["per_rank_samples_per_s"] == pytest.approx(two["samples_per_s"] / 2)
    assert two["threads_per_rank"] == 1  # as torchrun would give each rank
    spec = result.chart().to_dict()
    assert len(spec["layer"]) == 3 and spec == scaling_chart(df).to_dict()
    with pytest.raises(ValueError, match="world_sizes must be ints"):
        bench.scaling(world_sizes=(0, 2))


FACTORY = '''
import torch
from torch import nn


def make():
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))
    return {"model": nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(32, 4)), "data": ds,
            "loss_fn": nn.CrossEntropyLoss(), "device": "cpu", "name": "two-nodes"}
'''


@pytest.mark.slow
def test_cli_joins_a_torchrun_job_of_two_simulated_nodes(tmp_path) -> None:
    import json
    import subprocess
    import sys

    from workbench.launch.ranks import free_port

    (tmp_path / "nodefactory.py").write_text(FACTORY)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(tmp_path), os.path.dirname(os.path.dirname(wb.__file__))])}
    port = free_port()
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nnodes=2", "--nproc-per-node=1", "--rdzv-backend=c10d",
           f"--rdzv-endpoint=127.0.0.1:{port}", "-m", "workbench", "run", "--model", "nodefactory:make", "--json",
           "--quiet", "--steps", "3", "--warmup-steps", "1", "--batch-size", "8", "--ddp-bucket-cap-mb", "1",
           "--log-path", str(tmp_path / "log")]
    nodes = [subprocess.Popen([*cmd[:5], f"--node-rank={n}", *cmd[5:]], cwd=tmp_path, env=env, text=True,
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE) for n in (0, 1)]
    outs = [p.communicate(timeout=240) for p in nodes]
    assert [p.returncode for p in nodes] == [0, 0], "\n\n".join(
        f"node {n}: " + job_output(p, e) for n, (p, (_, e)) in enumerate(zip(nodes, outs)))
    printed = [o for o, _ in outs if o.strip()]
    assert len(printed) == 1  # rank 0 alone prints one JSON document
    doc = json.loads(printed[0])  # the one --json document (docs/cli.md: the JSON envelope)
    assert doc["ok"] and doc["command"] == "run"
    rec = doc["result"]
    assert rec["status"] == "ok" and rec["world_size"] == 2 and rec["ddp_bucket_cap_mb"] == 1
    assert rec["samples_per_step"] == 16 and rec["extra"]["distributed"]["world_size"] == 2
    log = (tmp_path / "log" / "two-nodes.jsonl").read_text().splitlines()
    assert len(log) == 1 and json.loads(log[0])["world_size"] == 2  # only rank 0 appended


@pytest.mark.slow
def test_ctrl_c_stops_every_rank_records_and_reraises(tmp_path) -> None:
    import _thread
    import signal
    import threading

    FAULT.update(kind="hang", at=3)
    bench = make_bench(tmp_path, collective_timeout_s=60.0)
    rss = psutil.Process().memory_info().rss
    # a shell's background job inherits SIGINT ignored, and interrupt_main() then does nothing
    # (`make test &` failed so); a kernel, and this test, want Ctrl-C
    previous = signal.signal(signal.SIGINT, signal.default_int_handler)
    threading.Timer(3.0, _thread.interrupt_main).start()  # Ctrl-C in the caller's (main) thread
    try:
        with pytest.raises(wb.TrialInterrupted) as info:
            bench.run(world_size=2)
    finally:
        FAULT["kind"] = None
        signal.signal(signal.SIGINT, previous)
    assert info.value.result.status == "interrupted" and "all 2 ranks ended" in info.value.result.message
    assert bench.trials[-1].status == "interrupted"  # recorded before re-raising
    assert no_children()
    again = bench.run(world_size=2)
    assert again.ok, why(again)
    # the ranks' memory went with their processes; the launcher itself keeps almost nothing
    assert psutil.Process().memory_info().rss - rss < 64e6


@pytest.mark.slow
def test_every_rank_hung_outside_a_collective_is_ended_by_the_watchdog(tmp_path, monkeypatch) -> None:
    from workbench.launch import ranks as launch

    monkeypatch.setattr(launch, "HANG_GRACE_S", 1.0)  # the watchdog fires after timeout + 1 s of no progress
    FAULT.update(kind="hang", rank="all", at=3)
    bench = make_bench(tmp_path, collective_timeout_s=3.0)
    try:
        r = bench.run(world_size=2)
    finally:
        FAULT.update(kind=None, rank=1)
    assert r.status == "error" and "no rank progressed for 4 s" in r.message
    assert "rank 0 in the model's forward" in r.message and "rank 1 in the model's forward" in r.message
    assert no_children()


def test_panel_distributed_group_enables_ddp_controls_only_above_one_process(tmp_path) -> None:
    W = pytest.importorskip("ipywidgets")
    from workbench.faces.panel.controls import GROUPS, KnobControls

    assert GROUPS["Distributed"][:2] == ["world_size", "strategy"]
    assert all(n.startswith(("ddp_", "fsdp_")) for n in GROUPS["Distributed"][2:])
    controls = KnobControls(W, make_bench(tmp_path, log=None))
    c = controls.controls
    c["ddp_no_sync"].value = True
    k = controls.knobs()
    assert k.world_size == 1 and not k.ddp_no_sync  # disabled at world_size=1: left off
    assert c["ddp_no_sync"].disabled and "world_size=1" in c["ddp_no_sync"].tooltip
    c["world_size"].value = 2
    c["accum_steps"].value = 2
    k = controls.knobs()
    assert k.world_size == 2 and k.ddp_no_sync and not c["ddp_bucket_cap_mb"].disabled
    assert c["fsdp_prefetch"].disabled and "strategy='fsdp2'" in c["fsdp_prefetch"].tooltip
    c["ddp_no_sync"].value = False
    c["strategy"].value = "fsdp2"
    c["fsdp_prefetch"].value = 1
    k = controls.knobs()
    assert k.strategy == "fsdp2" and k.fsdp_prefetch == 1 and not c["fsdp_prefetch"].disabled
    assert c["ddp_bucket_cap_mb"].disabled and "strategy='ddp'" in c["ddp_bucket_cap_mb"].tooltip


@pytest.mark.slow
def test_memory_fit_runs_whole_jobs_so_ranks_agree(tmp_path) -> None:
    FAULT["kind"] = None
    bench = make_bench(tmp_path, steps=3, warmup_steps=1)
    fit = bench.fit_memory(max_bytes=1 << 40, effective_batch=16, base=bench.knobs(world_size=2))
    assert fit.fits and fit.knobs.world_size == 2
    # one status and one peak (the largest rank's) per job: the search never sees a rank alone
    assert fit.result.extra["distributed"]["world_size"] == 2 and fit.result.peak_memory_bytes > 0
    assert all(t.knobs.world_size == 2 for t in bench.trials)


@pytest.mark.slow
@pytest.mark.fixed_warmup  # both trials' windows start at the same step
def test_two_ranks_train_like_one_process_at_the_same_global_batch(tmp_path) -> None:
    """DDP on 2 ranks x batch 4 against one process x batch 8, sequential data: rank r reads samples
    r, r+2, ... so each step's global batch is the one process's batch; DDP averages the gradients and
    the trial averages the ranks' losses, so the per-step losses are the same (fp32, to rounding)."""
    FAULT["kind"] = None
    g = torch.Generator().manual_seed(0)
    ds = torch.utils.data.TensorDataset(torch.randn(256, 16, generator=g), torch.randint(0, 4, (256,), generator=g))
    bench = wb.Workbench(
        FaultyMLP(), torch.utils.data.DataLoader(ds, batch_size=8, shuffle=False), loss_fn=nn.CrossEntropyLoss(),
        optimizer=lambda p: torch.optim.SGD(p, lr=0.05), device="cpu", log=None, steps=6, warmup_steps=2,
        collective_timeout_s=5.0)
    one = bench.run(batch_size=8)
    two = bench.run(batch_size=4, world_size=2)
    assert one.ok and two.ok, why(one, two)
    assert two.samples_per_step == one.samples_per_step == 8
    assert two.losses == pytest.approx(one.losses, abs=1e-5, rel=0)
    assert no_children()
