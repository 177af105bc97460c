"""The allocator knob (core/knobs/process.py, core/system.py): its values, the environment each mode
starts with, the refusal that names the package, the mode read back, the exported script's launch
line and check, the table's and comparisons' words; and (slow) trials in fresh processes."""

from __future__ import annotations

import os
import subprocess
import sys
from dataclasses import replace

import pytest
import torch

import workbench as wb
from workbench.core import system
from workbench.core.knobs import process
from workbench.core.measure import TrialResult, environment
from workbench.results.comparison import allocator_note

HAVE_TCMALLOC = system.allocator_library("tcmalloc") is not None


def test_values_are_checked_and_none_is_the_process_as_it_is():
    assert wb.Knobs().allocator is None and wb.Knobs(allocator="tcmalloc").label() == "allocator=tcmalloc"
    with pytest.raises(ValueError, match="allocator='mimalloc' is not one of"):
        wb.Knobs(allocator="mimalloc")
    assert process.allocator_process_env(None, None) == {}


def test_each_mode_s_environment_starts_clean():
    glibc = system.allocator_env("glibc")
    assert glibc["LD_PRELOAD"] is None and glibc["MALLOC_MMAP_THRESHOLD_"] is None  # nothing inherited
    kept = system.allocator_env("glibc-kept")
    assert kept["MALLOC_MMAP_THRESHOLD_"] == str(system.KEEP_MMAP_BYTES) and kept["LD_PRELOAD"] is None
    with pytest.raises(ValueError, match="not one of"):
        system.allocator_env("hoard")


def test_a_missing_library_is_refused_naming_the_package(monkeypatch, make_bench):
    monkeypatch.setattr(process, "allocator_library", lambda mode: None)
    monkeypatch.setattr(system, "allocator_library", lambda mode: None)
    with pytest.raises(ValueError, match=r"apt-get install libtcmalloc-minimal4 libjemalloc2.*gperftools jemalloc"):
        make_bench(log=None).run(allocator="jemalloc")
    with pytest.raises(ValueError, match="conda install"):
        system.allocator_env("tcmalloc")


def test_the_mode_is_read_back_from_the_maps(tmp_path):
    maps = tmp_path / "maps"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libjemalloc.so.2\n")
    assert system.mapped_allocator(maps) == "jemalloc"
    maps.write_text("7f00-7f01 r-xp 0 08:01 1 /usr/lib/x86_64-linux-gnu/libc.so.6\n")
    assert system.mapped_allocator(maps) is None
    assert system.mapped_allocator(tmp_path / "missing") is None


@pytest.mark.parametrize(("mapped", "env", "want"), [
    ("jemalloc", {}, "jemalloc"), ("tcmalloc", system.KEPT_ENV, "tcmalloc"),  # a mapped library wins
    (None, system.KEPT_ENV, "glibc-kept"), (None, {}, "glibc")])
def test_the_process_s_mode_follows_its_maps_and_variables_and_every_trial_records_it(monkeypatch, mapped, env,
                                                                                         want):
    if system._glibc() is None:
        pytest.skip("not glibc")
    monkeypatch.setattr(system, "mapped_allocator", lambda maps="/proc/self/maps": mapped)
    monkeypatch.setattr(system, "_kept", False)
    for k in system.KEPT_ENV:
        monkeypatch.delenv(k, raising=False)
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    assert system.process_allocator() == want
    assert environment(torch.device("cpu"))["allocator"] == want  # every trial records it


def test_a_preload_that_takes_is_seen_inside_the_process():
    if not HAVE_TCMALLOC:
        pytest.skip("libtcmalloc_minimal is not installed here")
    env = {**os.environ, "LD_PRELOAD": system.allocator_library("tcmalloc"), "PYTHONPATH": os.getcwd()}
    out = subprocess.run([sys.executable, "-c", "from workbench.core import system; print(system.process_allocator())"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert out.stdout.strip() == "tcmalloc", out.stderr


def test_the_script_carries_the_launch_line_and_checks_the_mode():
    code = wb.Knobs(allocator="glibc-kept").to_code()
    assert f"#   MALLOC_MMAP_THRESHOLD_={system.KEEP_MMAP_BYTES} " in code and "python train.py" in code
    assert 'os.environ.get("MALLOC_MMAP_THRESHOLD_")' in code and "warnings.warn(" in code
    compile(code, "train.py", "exec")
    ddp = wb.Knobs(allocator="glibc", world_size=2).to_code()
    assert "(every rank inherits it)" in ddp and "env -u LD_PRELOAD" in ddp and "torchrun --standalone" in ddp
    assert ddp.index("warnings.warn(") > ddp.index("dist.init_process_group")  # each rank checks
    assert "allocator" not in wb.Knobs().to_code()  # the process as it is: nothing to pin


def test_a_library_path_with_a_space_and_quotes_stays_one_word_in_the_launch_line(monkeypatch):
    import shlex

    odd = "/opt/my libs/it's \"x\"/libtcmalloc_minimal.so.4"
    monkeypatch.setattr(process, "allocator_library", lambda mode: odd)
    code = wb.Knobs(allocator="tcmalloc").to_code()
    compile(code, "train.py", "exec")  # the check's warning is still valid Python
    launch = next(line for line in code.splitlines() if line.startswith("#   LD_PRELOAD="))
    assert shlex.split(launch[4:])[:2] == [f"LD_PRELOAD={odd}", "python"]
    warned = next(line for line in code.splitlines() if "warnings.warn(" in line)
    assert shlex.split(eval(warned.strip()[len("warnings.warn("):-1]).split("(", 1)[1])[0] == f"LD_PRELOAD={odd}"
    from workbench.faces.hf import training_kwargs

    said = next(x for x in training_kwargs(wb.Knobs(allocator="tcmalloc"), blocks=[], optim=None,
                                           device_type="cpu").left_out if x.startswith("allocator="))
    assert shlex.split(said.split("`")[1])[0] == f"LD_PRELOAD={odd}"


def test_a_trial_s_script_pins_the_mode_its_process_ran_in():
    r = TrialResult(knobs=wb.Knobs(), status="ok", env={"allocator": "glibc-kept"})
    assert r.pinned_knobs() == wb.Knobs(allocator="glibc-kept") and "MALLOC_TRIM_THRESHOLD_" in r.to_code()
    old = TrialResult(knobs=wb.Knobs(), status="ok", env={})  # a log from before the record
    assert old.pinned_knobs() == wb.Knobs()


def _ok(tid: int, rate: float, mode: str, **knobs) -> TrialResult:
    return TrialResult(knobs=wb.Knobs(batch_size=8, **knobs), status="ok", trial_id=tid, samples_per_s=rate,
                       step_times_s=(8 / rate,) * 4, samples_per_step=8, env={"allocator": mode})


def test_comparisons_say_when_modes_differ_or_the_allocator_is_compared():
    a, b = _ok(1, 100, "glibc"), _ok(2, 120, "glibc-kept", channels_last=True)
    assert "different allocator modes (glibc, glibc-kept)" in allocator_note([a], [b])
    assert allocator_note([a], [_ok(3, 110, "glibc", channels_last=True)]) == ""
    c = _ok(4, 130, "tcmalloc", allocator="tcmalloc")
    pinned = replace(a, knobs=a.knobs.replace(allocator="glibc"))
    assert "The allocator is the knob compared" in allocator_note([pinned], [c])
    assert "never interleaved in one process" in wb.compare(pinned, c).note


def test_the_table_marks_rows_of_another_mode(make_bench):
    bench = make_bench(log=None)
    bench.log.append(_ok(None, 100, "glibc"))
    bench.log.append(_ok(None, 130, "tcmalloc", allocator="tcmalloc"))
    bench.log.append(_ok(None, 101, "glibc", channels_last=True))
    df = bench.results
    assert list(df["process_mode"]) == ["glibc", "tcmalloc", "glibc"]
    assert list(df["mode_differs"]) == [False, True, False]


def test_a_process_knob_never_interleaves():
    from workbench.deciding.interleave import why_not

    assert "sets how a process starts" in why_not(wb.Knobs(), wb.Knobs(allocator="glibc-kept"))
    both = why_not(wb.Knobs(allocator="glibc-kept"), wb.Knobs(allocator="glibc-kept", channels_last=True))
    assert "fresh process" in both


@pytest.mark.slow
def test_an_allocator_trial_runs_in_a_fresh_process_in_its_mode(make_bench):
    mode = "tcmalloc" if HAVE_TCMALLOC else "glibc-kept"
    bench = make_bench()
    r = bench.run(allocator=mode)
    assert r.ok, r.message
    assert r.env["allocator"] == mode and r.env["process"]["pid"] != os.getpid()
    assert (r.env["process"]["mapped"] == "tcmalloc") == (mode == "tcmalloc")
    here = bench.run()
    assert here.env["allocator"] == system.process_allocator() and "process" not in here.env
    assert f"allocator={mode!r}" in bench.to_code(r.trial_id)
    c = bench.compare(here, r, rounds=1)  # the default side pinned to this process's mode, both fresh
    a_side, b_side = [bench.log.get(t) for t in c.a_trials], [bench.log.get(t) for t in c.b_trials]
    assert [t.knobs.allocator for t in a_side] == [system.process_allocator()] * len(a_side)
    assert all(t.env["allocator"] == mode and "process" in t.env for t in b_side)  # each in its mode, fresh
    assert all("process" in t.env and t.env["process"]["pid"] != os.getpid() for t in a_side + b_side)
    assert c.a_rates == tuple(t.samples_per_s for t in a_side) and c.b_rates == tuple(t.samples_per_s for t in b_side)
    assert "pinned to" in c.note and "The allocator is the knob compared" in c.note
    assert bench.trials[-1].env["process"]["pid"] != os.getpid()


@pytest.mark.slow
def test_a_mode_that_did_not_take_ends_only_its_trial(make_bench, monkeypatch):
    monkeypatch.setattr(process, "allocator_env", lambda mode: {"LD_PRELOAD": "/nonexistent/libtcmalloc_x.so"})
    bench = make_bench()
    r = bench.run(allocator="tcmalloc" if HAVE_TCMALLOC else "glibc-kept")
    assert r.status == "error" and "did not start as asked" in r.message and r.where == "process"
    assert bench.run().ok


def test_a_glibc_trial_s_script_and_a_trainers_words_settle_malloc_as_the_trial_did():
    """The exported loop settles glibc's thresholds at its top (the trial's process did, before the trial); a
    Trainer's or a Lightning fit's export says to call wb.settle_malloc(); other modes have nothing to settle."""
    code = wb.Knobs(allocator="glibc").to_code()
    assert "settle_malloc()" in code and "import ctypes" in code
    assert code.index("settle_malloc()") < code.index("for batch in loader")  # before the loop
    assert "settle_malloc" not in wb.Knobs(allocator="glibc-kept").to_code()
    from workbench.faces.hf import training_kwargs

    said = next(x for x in training_kwargs(wb.Knobs(allocator="glibc"), blocks=[], optim=None,
                                           device_type="cpu").left_out if x.startswith("allocator="))
    assert "wb.settle_malloc()" in said and "env -u LD_PRELOAD" in said
    assert wb.settle_malloc is system.settle_malloc
