"""Soak: 100 trials in a row on the demos with mixed knobs; nothing grows, nothing leaks, nothing is lost."""

from __future__ import annotations

import threading
import warnings

import psutil
import pytest

import workbench as wb
from workbench.results import ResultLog

# One cycle of 10 (demo, knobs) pairs, repeated: after the first cycle every code path has run once,
# so from then on resident memory and thread counts must stay flat.
CYCLE = [
    ("jpeg", {}),
    ("jpeg", {"num_workers": 2, "cpu_threads": 1}),
    ("cnn", {"channels_last": True, "amp": "bf16"}),
    ("cnn", {"num_workers": 1, "persistent_workers": True, "prefetch_factor": 4}),
    ("mlp-memory", {"checkpoint": "all", "accum_steps": 2}),
    ("mlp-memory", {"data": "cached"}),
    ("transformer", {"amp": "bf16"}),
    ("transformer", {"checkpoint": "all", "cpu_threads": 1}),
    ("jpeg", {"num_workers": 1, "pin_memory": True}),
    ("cnn", {"amp": "fp16", "accum_steps": 2}),
]


@pytest.mark.slow
def test_soak_100_trials(tmp_path):
    log = tmp_path / "soak.jsonl"
    benches = {name: wb.demo(name, size="tiny", log=log, steps=3, warmup_steps=1) for name in dict(CYCLE)}
    proc = psutil.Process()
    rss, os_threads = [], []
    statuses = []
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # fp16 on CPU warns by design
        for i in range(100):
            name, knobs = CYCLE[i % len(CYCLE)]
            bench = benches[name]
            if knobs.get("checkpoint") == "all":
                knobs = {**knobs, "checkpoint": bench.blocks}
            statuses.append(bench.run(**knobs).status)
            if i == 9:
                py_threads = {t.name for t in threading.enumerate()}
            assert proc.children(recursive=True) == [], f"worker processes left after trial {i + 1}"
            rss.append(proc.memory_info().rss)
            os_threads.append(proc.num_threads())
    growth = rss[-1] / rss[9] - 1
    print(f"soak: RSS after trial 10 {rss[9] / 1e6:.1f} MB, after 100 {rss[-1] / 1e6:.1f} MB "
          f"({growth:+.1%}); OS threads {os_threads[9]} -> {os_threads[-1]}")
    assert set(statuses) <= {"ok", "nan"}, statuses
    assert growth < 0.05
    assert os_threads[-1] <= os_threads[9]
    assert {t.name for t in threading.enumerate()} == py_threads
    assert len(log.read_text().splitlines()) == 100
    assert len(ResultLog(log).trials) == 100
