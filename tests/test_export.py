"""bench.to_tensorboard: one run per trial, knobs as hparams, per-step scalars; read back with
TensorBoard's own EventAccumulator."""

import pytest

pytest.importorskip("tensorboard", reason="the tensorboard extra is not installed (pip install 'tuning-workbench[tensorboard]')")

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.plugins.hparams import plugin_data_pb2

from workbench.faces.export import hparams_of


def _load(run_dir):
    acc = EventAccumulator(str(run_dir), size_guidance={"scalars": 0})
    acc.Reload()
    return acc


def _session_hparams(acc) -> dict:
    content = acc.PluginTagToContent("hparams")
    start = plugin_data_pb2.HParamsPluginData.FromString(content["_hparams_/session_start_info"])
    return {k: v.WhichOneof("kind") and getattr(v, v.WhichOneof("kind")) for k, v in start.session_start_info.hparams.items()}


def test_one_run_per_trial_with_hparams_and_step_scalars(make_bench, tmp_path):
    bench = make_bench(steps=4)
    a = bench.run(progress=False)
    b = bench.run(num_workers=0, cpu_threads=1, progress=False)
    runs = bench.to_tensorboard(tmp_path / "tb")
    assert [p.name for p in runs] == ["trial-0001", "trial-0002"]
    for run, r in zip(runs, (a, b)):
        acc = _load(run)
        tags = set(acc.Tags()["scalars"])
        assert {"step/time_ms", "step/loss", "step/data_wait_ms", "hparam/samples_per_s"} <= tags
        times = [e.value for e in acc.Scalars("step/time_ms")]
        assert times == pytest.approx([t * 1e3 for t in r.step_times_s], rel=1e-6)
        assert [e.step for e in acc.Scalars("step/loss")] == [1, 2, 3, 4]
        assert acc.Scalars("hparam/samples_per_s")[0].value == pytest.approx(r.samples_per_s, rel=1e-6)
        hp = _session_hparams(acc)
        assert hp["batch_size"] == 8 and hp["status"] == "ok" and hp["trial_id"] == r.trial_id
    # cpu_threads is None in #1 and 1 in #2: one type (text) across runs for the hparams table
    assert _session_hparams(_load(runs[0]))["cpu_threads"] == "None"
    assert _session_hparams(_load(runs[1]))["cpu_threads"] == "1"


def test_exporting_again_does_not_duplicate_runs(make_bench, tmp_path):
    bench = make_bench()
    bench.run(progress=False)
    first = bench.to_tensorboard(tmp_path / "tb")
    bench.run(progress=False)
    second = bench.to_tensorboard(tmp_path / "tb")
    assert [p.name for p in second] == ["trial-0001", "trial-0002"] and second[0] == first[0]
    for run in second:
        assert len(list(run.glob("events.out.tfevents.*"))) == 1
        assert len(_load(run).Scalars("step/time_ms")) == 3


def test_failed_trials_export_without_metrics(make_bench, tmp_path):
    def step_fn(model, batch):
        raise RuntimeError("boom")

    bench = make_bench()
    bench.workload.step_fn = step_fn
    r = bench.run(progress=False)
    assert r.status == "error"
    (run,) = bench.to_tensorboard(tmp_path / "tb")
    acc = _load(run)
    assert "step/time_ms" not in acc.Tags()["scalars"]
    assert _session_hparams(acc)["status"] == "error"
    assert "hparam/samples_per_s" not in acc.Tags()["scalars"]


def test_hparams_keep_one_type_per_knob():
    import workbench as wb
    from workbench.core.measure import TrialResult

    rs = [TrialResult(knobs=wb.Knobs(cpu_threads=None), status="ok"), TrialResult(knobs=wb.Knobs(cpu_threads=2), status="ok")]
    hp = hparams_of(rs)
    assert [h["cpu_threads"] for h in hp] == ["None", "2"]
    assert all(type(h["batch_size"]) is int for h in hp)
    assert all(isinstance(h["pin_memory"], bool) for h in hp)


def test_wrong_input_names_the_fix(tmp_path):
    from workbench.faces.export import to_tensorboard

    with pytest.raises(TypeError, match=r"bench\.trials"):
        to_tensorboard([object()], tmp_path)
