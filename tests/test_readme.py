"""The README runs as written: every Python block, in order, in one namespace, with a small model and
dataset bound to the names the README uses (`model`, `train_dataset`), as a reader's cell would."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

README = Path(__file__).resolve().parents[1] / "README.md"
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)


def python_blocks(text: str) -> list[str]:
    """The README's ```python blocks, in order."""
    return [body for lang, body in FENCE.findall(text) if lang == "python"]


def test_python_blocks_are_found_in_order():
    blocks = python_blocks("x\n```python\na = 1\n```\n```bash\nmake lab\n```\n```python\nb = a\n```\n")
    assert blocks == ["a = 1\n", "b = a\n"]


@pytest.mark.slow
@pytest.mark.worker  # as a reader runs it: trials in the workbench's worker process
def test_every_readme_python_block_runs_in_order(tmp_path, monkeypatch, capsys):
    """The example measures a baseline, then one change, compares them and reads the answer."""
    import workbench as wb
    from workbench.demos import DEMOS

    blocks = python_blocks(README.read_text(encoding="utf-8"))
    assert len(blocks) >= 2 and "wb.Workbench(model, train_dataset" in blocks[0]
    parts = DEMOS["cnn"].build("tiny")  # a small CNN on (image, label) batches: the README's CrossEntropyLoss
    monkeypatch.chdir(tmp_path)  # the default log folder, ./workbench-runs
    scope: dict = {"model": parts["model"], "train_dataset": parts["data"], "__name__": "__main__"}
    for i, block in enumerate(blocks):
        exec(compile(block, f"README.md python block {i + 1}", "exec"), scope)
    bench, c = scope["bench"], scope["c"]
    assert isinstance(bench, wb.Workbench) and (tmp_path / "workbench-runs").is_dir()
    assert c.answer in ("faster", "slower", "same", "undecided") and c.answer in capsys.readouterr().out
    df = bench.results.set_index("trial_id")
    base, change = scope["base"], scope["change"]
    assert base.ok and change.ok and bench.baseline.trial_id == base.trial_id
    assert set(df["ran_in"]) == {"worker"}
    assert df.loc[base.trial_id, "baseline"] and df.loc[base.trial_id, "label"] == "defaults"
    assert df.loc[change.trial_id, "label"] == f"batch_size={2 * base.knobs.batch_size}"  # by its knobs
