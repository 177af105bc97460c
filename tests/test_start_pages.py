"""The start pages: one screen per reader, linked first from the README, and their code runs as written.

Each page in docs/start-*.md has an install line, one Python block (the lines that matter), the shape of the
answer in a text block, and where to go next. The shape is checked against what the code prints, so a page
cannot keep narrating a format the package no longer has; the Python blocks run with small stand-ins bound
to the names a reader supplies (`model`, `train_dataset`, `trainer`, ...)."""

from __future__ import annotations

import dataclasses
import re

import pytest
from conftest import ROOT

README = ROOT / "README.md"
START = sorted((ROOT / "docs").glob("start-*.md"))
FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.MULTILINE | re.DOTALL)
READERS = {"start-your-model.md", "start-hugging-face.md", "start-lightning.md", "start-slurm.md",
           "start-workshop.md"}


def blocks(page, lang: str) -> list[str]:
    return [body for kind, body in FENCE.findall(page.read_text(encoding="utf-8")) if kind == lang]


def shape_pattern(line: str) -> re.Pattern:
    """A page's answer shape as a pattern: each `<placeholder>` stands for any text."""
    parts = re.split(r"<[^<>\n]+>", line.strip())
    return re.compile(".+?".join(re.escape(p) for p in parts) + r"\Z")


def test_every_reader_has_a_page_and_the_readme_links_them_first():
    assert {p.name for p in START} == READERS
    text = README.read_text(encoding="utf-8")
    section = text[text.index("## Who are you?"):]
    section = section[:section.index("\n## ", 1)]
    assert text.index("## Who are you?") < text.index("## Set-up"), "the reader's page comes before the set-up"
    for name in READERS:
        assert f"(docs/{name})" in section, f"the README's 'Who are you?' does not link docs/{name}"
    assert "(docs/cluster.md)" in section


@pytest.mark.parametrize("page", START, ids=lambda p: p.name)
def test_a_start_page_is_one_screen_with_install_code_answer_and_next(page):
    text = page.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= 45, f"{page.name} is longer than one screen"
    first = text.split("\n\n")[1]
    assert first.startswith("This page answers"), f"{page.name} does not open with the question it answers"
    assert re.search(r'^    pip install "tuning-workbench\[\w+\]"$', text, re.M), f"{page.name}: no install line"
    assert len(blocks(page, "python")) == 1, f"{page.name}: one Python block, the lines that matter"
    for heading in ("## The five lines that matter", "## What the answer looks like", "## Where to go next"):
        assert heading in text, f"{page.name}: no {heading!r}"


def test_the_shape_check_can_fail():
    pattern = shape_pattern("#<B> is <N>% faster than #<A> (95% interval +<L>% … +<H>%, <how>).")
    assert pattern.match("#2 is 5.0% faster than #1 (95% interval +1.0% … +9.0%, 3 trials each).")
    assert not pattern.match("#2 is 5.0% quicker than #1 (95% interval +1.0% … +9.0%, 3 trials each).")


@pytest.mark.parametrize("page", [p for p in START if p.name != "start-workshop.md"], ids=lambda p: p.name)
def test_the_answer_shape_is_what_the_code_prints(page):
    """A faster comparison as the code prints it (on samples/s, and on tokens/s for the Hugging Face page)."""
    from workbench.results.stats import decide

    c = decide([100.0, 101.0, 99.0], [150.0, 151.0, 149.0], a_trials=[1, 1, 1], b_trials=[2, 2, 2])
    if page.name == "start-hugging-face.md":
        c = dataclasses.replace(c, rate="tokens/s")
    shapes = [line for block in blocks(page, "text") for line in block.splitlines() if line.strip()]
    assert shapes and all(shape_pattern(s).match(str(c)) for s in shapes), (page.name, shapes, str(c))


def run_page(name: str, scope: dict) -> dict:
    code = blocks(ROOT / "docs" / name, "python")[0]
    scope.setdefault("__name__", "__main__")
    exec(compile(code, f"docs/{name}", "exec"), scope)
    return scope


ANSWERS = ("faster", "slower", "same", "undecided")


@pytest.fixture
def short_trials(monkeypatch):
    """`wb.Workbench` with short trials by default (6 steps after 1 warm-up step) and `rounds="auto"` capped at
    2 rounds, `from_trainer` and `from_lightning` included: the page's code runs as written; what is checked
    is that it runs and answers, not a measurement."""
    import workbench as wb

    class ShortTrials(wb.Workbench):
        def __init__(self, *args, **kwargs):
            kwargs.setdefault("steps", 6)
            kwargs.setdefault("warmup_steps", 1)
            super().__init__(*args, **kwargs)

        def compare(self, a, b, rounds=0, **kwargs):
            kwargs.setdefault("max_rounds", 2)
            return super().compare(a, b, rounds, **kwargs)

    monkeypatch.setattr(wb, "Workbench", ShortTrials)


@pytest.mark.slow
def test_your_model_page_runs_as_written(short_trials, tmp_path, monkeypatch, capsys):
    from workbench.demos import DEMOS

    parts = DEMOS["cnn"].build("tiny")
    monkeypatch.chdir(tmp_path)
    scope = run_page("start-your-model.md", {"model": parts["model"], "train_dataset": parts["data"]})
    assert scope["base"].ok and scope["workers"].ok and scope["c"].answer in ANSWERS
    assert str(scope["c"]) in capsys.readouterr().out


@pytest.mark.slow
def test_hugging_face_page_runs_as_written(short_trials, tmp_path, monkeypatch):
    pytest.importorskip("transformers")
    pytest.importorskip("accelerate")
    from test_hf import trainer_of

    monkeypatch.chdir(tmp_path)
    scope = run_page("start-hugging-face.md", {"trainer": trainer_of()})
    assert scope["plain"].ok and scope["grouped"].ok and scope["c"].answer in ANSWERS
    assert scope["c"].rate == "tokens/s"  # the two pad differently: the answer is on tokens/s, as the page says
    args = scope["args"]  # transformers' newer spelling, or its older flag
    assert args.get("train_sampling_strategy") == "group_by_length" or args.get("group_by_length") is True


@pytest.mark.slow
def test_lightning_page_runs_as_written(short_trials, tmp_path, monkeypatch):
    pytest.importorskip("lightning")
    from test_lightning import Data, Net, trainer

    monkeypatch.chdir(tmp_path)
    scope = run_page("start-lightning.md", {"module": Net(), "datamodule": Data(), "trainer": trainer(max_steps=50)})
    assert scope["start"].ok and scope["workers"].ok and scope["c"].answer in ANSWERS
    assert scope["out"].dataloader["num_workers"] == 2


@pytest.mark.slow
def test_workshop_page_runs_as_written(tmp_path, monkeypatch):
    """On the demo's tiny size with short trials: the mechanics, not a measurement."""
    import functools

    import workbench as wb

    monkeypatch.setattr(wb, "demo", functools.partial(wb.demo, size="tiny", steps=4, warmup_steps=1))
    scope = run_page("start-workshop.md", {"folder": str(tmp_path)})
    summary = scope["ws"].summary()
    assert all(r.ok for r in scope["mine"]) and scope["ws"].participants == ["ana"]
    assert {"machines", "faster", "same", "slower", "undecided", "failed", "median_speedup"} <= set(summary.columns)
