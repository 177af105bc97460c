"""Device facts from the node the trials run on (core/devicefacts.py, faces/nodefacts.py).

A fake executor stands for a GPU node: its probe job answers CUDA facts (an H100's) read from this CPU
host; its other jobs (the trials) really run here, on the CPU. What is tested is what the facts decide:
the tuner's space, the knobs' "changes nothing here" rules, `compare`'s answer without measuring, MFU's
peak, and which node's facts the workbench says it used.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import datetime
import json
import warnings

import pytest
from test_cluster import bench_on, needs_slurm, node_path, slurm  # noqa: F401  (fixtures)

import workbench as wb
from workbench.core.devicefacts import DeviceFacts, facts_here
from workbench.faces import nodefacts
from workbench.faces.unchanged import UNCHANGED
from workbench.launch.cluster import probe_node
from workbench.search.tune import stage_axes

H100 = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3", "bf16": True, "fp16": True, "tf32": True,
        "capability": "9.0", "cores": 8, "memory_bytes": 80 * 2**30}


class FakeGPUNode:
    """An executor whose node reports CUDA facts (an H100 and 8 cores) from this CPU host; every other job
    (trials, analyses) runs here in a thread. `parameters` stands for a submitit executor's resources."""

    def __init__(self, fail: bool = False) -> None:
        self.parameters = {"partition": "gpu", "gpus_per_node": 1}
        self.probes = 0
        self.fail = fail
        self._pool = concurrent.futures.ThreadPoolExecutor(1)  # not `executor`: this node is not this machine

    def submit(self, fn, *args, **kwargs):
        if fn is probe_node:
            self.probes += 1
            f = concurrent.futures.Future()
            if self.fail:
                f.set_exception(RuntimeError("sbatch: error: invalid partition specified: gpu"))
            else:
                here = DeviceFacts.from_dict(probe_node(*args))  # this host's facts, as a node reads them
                f.set_result(dataclasses.replace(here, where="node gpu-fake (probe job 77)", **H100).to_dict())
            return f
        import cloudpickle  # the job gets its own copy, as a node unpickles it (the workload travels by value)

        fn, args, kwargs = cloudpickle.loads(cloudpickle.dumps((fn, args, kwargs)))
        return self._pool.submit(fn, *args, **kwargs)


def axes(bench, stage):
    return dict(stage_axes(bench, stage, bench.defaults))


def test_a_cpu_host_tuning_for_a_gpu_node_gets_the_gpu_shaped_space(tmp_path):
    node = FakeGPUNode()
    bench = bench_on(node, tmp_path)
    assert bench.device.type == "cpu"  # this machine's one-step check ran on its CPU
    data, precision, compile_ = axes(bench, "data"), axes(bench, "precision"), axes(bench, "compile")
    assert data["pin"] == [{"pin_memory": True}]
    assert {w["num_workers"] for w in data["workers"]} == {4, 8}  # half and all of the node's 8 cores
    assert all(w["cpu_threads"] is None for w in data["workers"])  # no CPU compute threads raced on a GPU node
    assert precision["amp"] == [{"amp": "bf16"}] and precision["matmul"] == [{"matmul_precision": "high"}]
    assert [c["compile"] for c in compile_["compile"]] == ["default", "max-autotune", "reduce-overhead"]
    assert node.probes == 1 and bench._facts.type == "cuda" and bench.workload.facts is bench._facts


def test_a_gpu_without_tf32_or_bf16_is_offered_fp16_and_no_matmul_precision(tmp_path, monkeypatch):
    monkeypatch.setitem(H100, "bf16", False)
    monkeypatch.setitem(H100, "tf32", False)
    monkeypatch.setitem(H100, "name", "Tesla V100-SXM2-32GB")
    monkeypatch.setitem(H100, "capability", "7.0")
    precision = axes(bench_on(FakeGPUNode(), tmp_path), "precision")
    assert precision["amp"] == [{"amp": "fp16"}] and "matmul" not in precision


def test_pin_memory_on_the_gpu_node_is_measured_and_the_trial_says_whose_facts(tmp_path, capsys):
    node = FakeGPUNode()
    bench = bench_on(node, tmp_path)
    a = bench.run(progress=False)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "changes nothing in this step" warning
        b = bench.run(progress=False, pin_memory=True)
        c = bench.run(progress=False, cudnn_benchmark=True)
    assert a.ok and b.ok and c.ok, (a.message, b.message, c.message)
    assert not any("changes nothing in this step" in n for n in b.notes + c.notes)
    said = capsys.readouterr()
    out = said.out + said.err
    assert out.count("Device facts from node gpu-fake (probe job 77): cuda NVIDIA H100 80GB HBM3") == 1, out
    assert b.env["facts"].startswith("node gpu-fake (probe job 77), cuda NVIDIA H100")
    assert bench.trials[-1].env["facts"] == b.env["facts"]  # and in the log
    for trial in (b, c):  # measured, not answered "same" without measuring
        assert bench.compare(a, trial).method != UNCHANGED
    assert node.probes == 1


def test_the_facts_are_cached_beside_the_log_with_their_date_and_probed_again_when_resources_change(tmp_path, capsys):
    node = FakeGPUNode()
    assert bench_on(node, tmp_path)._facts.type == "cuda" and node.probes == 1
    cache = tmp_path / "runs" / nodefacts.CACHE_FILE
    entry = next(iter(json.loads(cache.read_text()).values()))
    assert entry["resources"]["executor"][0]["parameters"] == {"partition": "gpu", "gpus_per_node": 1}
    assert entry["facts"]["name"] == H100["name"] and entry["facts"]["probed_at"]
    capsys.readouterr()

    again = bench_on(node, tmp_path)  # a new kernel on the same log: no probe job
    assert again._facts.name == H100["name"] and node.probes == 1
    said = capsys.readouterr()
    assert "(cached in " in said.out + said.err

    node.parameters["gpus_per_node"] = 4  # other resources: another node type, probed
    assert again._facts.type == "cuda" and node.probes == 2

    table = json.loads(cache.read_text())
    old = (datetime.datetime.now() - datetime.timedelta(days=nodefacts.MAX_AGE_DAYS + 1)).isoformat(timespec="seconds")
    for e in table.values():
        e["facts"]["probed_at"] = old
    cache.write_text(json.dumps(table))
    assert bench_on(node, tmp_path)._facts.type == "cuda" and node.probes == 3  # too old: read again


def test_a_failing_probe_falls_back_to_this_machines_facts_naming_the_fix(tmp_path):
    node = FakeGPUNode(fail=True)
    bench = bench_on(node, tmp_path)
    with pytest.warns(UserWarning, match=r"probe job .* failed \(RuntimeError: sbatch: error: invalid partition.*"
                                         r"Fix the executor so that a job runs.*probes again"):
        facts = bench._facts
    assert facts.here and facts.type == "cpu"
    assert "pin" not in axes(bench, "data")  # this machine's CPU-shaped space, said
    assert node.probes == 1  # warned once, not probed again at each decision
    node.fail = False
    bench._node._retry = dict.fromkeys(bench._node._retry, 0.0)  # RETRY_S later
    assert bench._facts.type == "cuda" and node.probes == 2 and "pin" in axes(bench, "data")


def test_without_an_executor_or_with_a_local_one_the_facts_are_this_machines(tmp_path, make_bench):
    assert make_bench()._facts.here
    with concurrent.futures.ThreadPoolExecutor(1) as pool:  # its jobs run here: no probe job
        assert bench_on(pool, tmp_path)._facts.where == "this machine"
    assert not (tmp_path / "runs" / nodefacts.CACHE_FILE).exists()


def test_mfu_takes_the_peak_of_the_nodes_device(tmp_path):
    from workbench.diagnose.flops import peak_flops

    bench = bench_on(FakeGPUNode(), tmp_path)
    bench._facts  # noqa: B018  (read: the workload carries them)
    peak, source = peak_flops(bench.workload, bench.knobs(amp="bf16"))
    assert peak == pytest.approx(989.4e12) and source == "NVIDIA H100 80GB HBM3 data sheet, dense bf16"


def test_device_facts_round_trip_and_bad_records_are_refused():
    f = facts_here("cpu")
    assert DeviceFacts.from_dict(json.loads(json.dumps(f.to_dict()))) == f
    assert DeviceFacts.from_dict({"type": "cuda", "future_field": 1}).type == "cuda"  # unknown fields dropped
    with pytest.raises(ValueError, match="'type'"):
        DeviceFacts.from_dict({"name": "H100"})
    assert f.cores >= 1 and f.memory_bytes > 0 and f.here and "cores" in f.line()


def test_the_thread_check_counts_the_nodes_cores():
    from workbench.diagnose.threads import thread_check

    node = DeviceFacts.from_dict({**H100, "where": "node gpu-fake"})
    check = thread_check(wb.Knobs(num_workers=6), facts=node)
    assert check["cores"] == 8 and check["main_threads"] == 8  # torch's default there: a thread per core
    assert check["oversubscribed"] and check["suggest_cpu_threads"] == 2


@pytest.mark.slow
@needs_slurm
def test_a_slurm_probe_job_reads_the_nodes_facts_and_other_resources_are_probed_again(slurm, tmp_path):  # noqa: F811
    bench = bench_on(slurm, tmp_path)
    first = bench._facts
    assert first.where.startswith("node ") and "(probe job " in first.where and not first.here
    assert first.type == "cpu" and first.cores == 1 and first.memory_bytes > 0  # slurm_cpus_per_task=1
    assert bench_on(slurm, tmp_path)._facts == first  # read back from beside the log: no second job
    slurm.update_parameters(slurm_cpus_per_task=2)
    second = bench._facts
    assert second.where != first.where and "(probe job " in second.where  # another job read them
    assert second.cores == min(2, facts_here("cpu").cores)
