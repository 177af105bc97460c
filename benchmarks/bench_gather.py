"""A large class: gather over P participants x T trials, and what a watch refresh re-reads.

Writes P learner logs of T trials each (records varied from one real trial of the tiny jpeg demo,
as `learner_session` would leave them), then times:
  gather      wb.gather(folder): list, read and table every file (the instructor's first call)
  refresh     a refresh after one learner appended one trial (what watch() does every few seconds)
  re-read     bytes read by that refresh (only the appended line should be read)
Goal (issue 21): gather over 300 x 20 <= 3 s on a 2-core machine.
Run: .venv/bin/python benchmarks/bench_gather.py [participants] [trials]
"""

from __future__ import annotations

import json
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import workbench as wb
from workbench.results.log import ResultLog, _clean

VARIANTS = [{}, {"data": "cached"}, {"num_workers": 2, "cpu_threads": 1}, {"amp": "bf16"}, {"batch_size": 16}]


def write_class(folder: Path, participants: int, trials: int, template: wb.TrialResult) -> None:
    rec = _clean(template.to_record())
    for p in range(participants):
        who = f"learner-{p:03d}"
        (folder / who).mkdir(parents=True)
        with open(folder / who / "demo-jpeg.jsonl", "w") as f:
            for i in range(trials):
                knobs = template.knobs.replace(**VARIANTS[i % len(VARIANTS)])
                r = {**rec, **knobs.to_dict(), "checkpoint": [], "trial_id": i + 1, "participant": who,
                     "samples_per_s": rec["samples_per_s"] * (1 + 0.04 * (((p * 31 + i * 7) % 21) - 10) / 10)}
                f.write(json.dumps(r) + "\n")


def main(participants: int = 300, trials: int = 20) -> None:
    seed = wb.demo("jpeg", size="tiny", log=None, steps=3, warmup_steps=1)
    template = seed.run(progress=False)
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        write_class(folder, participants, trials, template)
        size = sum(f.stat().st_size for f in folder.rglob("*.jsonl"))
        t0 = time.perf_counter()
        ws = wb.gather(folder)
        gathered = time.perf_counter() - t0
        assert len(ws.results) == participants * trials
        log = ResultLog(folder / "learner-007" / "demo-jpeg.jsonl", participant="learner-007")
        before = log.path.stat().st_size
        log.append(log.trials[-1])
        appended = log.path.stat().st_size - before
        real_read, read = os.read, []
        os.read = lambda fd, n: (lambda d: (read.append(len(d)), d)[1])(real_read(fd, n))
        try:
            t0 = time.perf_counter()
            assert ws.refresh()
            refreshed = time.perf_counter() - t0
        finally:
            os.read = real_read
        t0 = time.perf_counter()
        ws.summary()
        summary = time.perf_counter() - t0
    print(f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} cores, "
          f"python {platform.python_version()}; load average {os.getloadavg()[0]:.2f}")
    print(f"{participants} participants x {trials} trials ({size / 1e6:.1f} MB): gather {gathered:.2f} s, "
          f"summary {summary:.2f} s; refresh after one appended trial {refreshed:.3f} s, "
          f"read {sum(read):,} bytes (the appended line: {appended:,})")


if __name__ == "__main__":
    main(*(int(a) for a in sys.argv[1:3]))
