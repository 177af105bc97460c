"""The profile's stages (issue 48 item 3): each stage once; on a GPU the kernels each record_function
range queued (matched by correlation to their launch, whichever thread launched them), host time on the
CPU and for data; `explain` reads the same split. CUDA is exercised by a synthetic Chrome trace."""

from __future__ import annotations

import json

import pytest

from workbench.core import trace
from workbench.diagnose import explain as ex
from workbench.diagnose.profile import stage_frame


def _x(name, cat, ts, dur, tid=1, pid=1, corr=None):
    e = {"ph": "X", "cat": cat, "name": name, "ts": ts, "dur": dur, "pid": pid, "tid": tid}
    if corr is not None:
        e["args"] = {"correlation": corr}
    return e


def _cuda_step(t: float, corr: int) -> list[dict]:
    """One 1000 us step as torch.profiler writes it on CUDA: host ranges (user_annotation), their
    device-side twins (gpu_user_annotation, same names), launches and the kernels they queued."""
    ev = [_x("ProfilerStep#1", "user_annotation", t, 1000),
          _x("data", "user_annotation", t, 100),
          _x("cudaMemcpyAsync", "cuda_runtime", t + 50, 40, corr=corr),
          _x("Memcpy HtoD (Pageable -> Device)", "gpu_memcpy", t + 60, 20, pid=0, tid=7, corr=corr),
          _x("forward", "user_annotation", t + 100, 50),  # the host only launches: 50 us
          _x("cudaLaunchKernel", "cuda_runtime", t + 110, 5, corr=corr + 1),
          _x("forward", "gpu_user_annotation", t + 120, 300, pid=0, tid=7),
          _x("gemm_fwd", "kernel", t + 120, 250, pid=0, tid=7, corr=corr + 1),
          _x("backward", "user_annotation", t + 150, 700),  # .backward() blocks until autograd is done
          _x("cudaLaunchKernel", "cuda_runtime", t + 160, 5, tid=2, corr=corr + 2),  # autograd's thread
          _x("gemm_bwd", "kernel", t + 420, 500, pid=0, tid=7, corr=corr + 2),
          _x("backward", "gpu_user_annotation", t + 420, 520, pid=0, tid=7),
          _x("optimizer", "user_annotation", t + 850, 30),
          _x("cudaLaunchKernel", "cuda_runtime", t + 855, 5, corr=corr + 3),
          _x("adam", "kernel", t + 940, 50, pid=0, tid=7, corr=corr + 3)]
    return ev


def test_cuda_stages_are_the_kernels_each_range_queued_each_name_once(tmp_path):
    events = _cuda_step(0, 10) + _cuda_step(1000, 20)
    for e in events[15:]:
        e["name"] = "ProfilerStep#2" if e["name"] == "ProfilerStep#1" else e["name"]
    path = tmp_path / "g.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    spans, inside = trace.step_events(path)
    assert len(spans) == 2
    ms = trace.stage_ms(inside, len(spans))
    # data: the host range (the loader and the copy it waited for); the rest: kernel time, not the host's
    assert ms == pytest.approx({"data": 0.1, "forward": 0.25, "backward": 0.5, "optimizer": 0.05})
    frame = stage_frame(path)
    assert list(frame["stage"]) == list(trace.PHASES)  # once each, though the trace names each twice
    assert frame["share"].sum() == pytest.approx(1.0)
    s = ex.read_trace(path, median=False)  # explain's split is the same
    assert [s.phases[ex._PHASE_OF[k]] for k in trace.PHASES] == pytest.approx(list(ms.values()))
    kernels = s.ops[s.ops["kind"] == "kernel"].set_index("op")["phase"]
    assert kernels["gemm_bwd"] == "backward" and kernels["adam"] == "optimizer"


def test_cpu_stages_are_host_time(tmp_path):
    events = [_x("ProfilerStep#1", "user_annotation", 0, 1000), _x("data", "user_annotation", 0, 100),
              _x("forward", "user_annotation", 100, 300), _x("backward", "user_annotation", 400, 500),
              _x("optimizer", "user_annotation", 900, 80), _x("aten::mm", "cpu_op", 450, 400, tid=2)]
    path = tmp_path / "c.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events}))
    assert trace.stage_ms(trace.step_events(path)[1], 1) == pytest.approx(
        {"data": 0.1, "forward": 0.3, "backward": 0.5, "optimizer": 0.08})


def test_profile_step_on_cpu_names_each_stage_once(make_bench):
    from workbench.diagnose.profile import profile_step

    bench = make_bench(device="cpu")
    stages, _ops = profile_step(bench.workload, bench.defaults, steps=2)
    assert list(stages["stage"]) == list(trace.PHASES)
    assert (stages["ms_per_step"] > 0).all() and stages["share"].sum() == pytest.approx(1.0)
