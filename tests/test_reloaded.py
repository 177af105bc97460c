"""A log that outlives a kernel or an edit of the model (faces/reloaded.py, results/models.py): a new Workbench
says what it reloaded and which trial is the baseline, and never compares an edited model with the old one."""

from __future__ import annotations

import json

import torch
from torch import nn

import workbench as wb
from workbench.faces.reloaded import fingerprint


def mlp(hidden: int = 16) -> nn.Module:
    return nn.Sequential(nn.Linear(8, hidden), nn.ReLU(), nn.Linear(hidden, 4))


def test_the_fingerprint_names_the_structure_not_the_weights():
    torch.manual_seed(0)
    a = mlp()
    torch.manual_seed(1)
    assert fingerprint(a) == fingerprint(mlp())  # other weights, same model
    assert fingerprint(a) != fingerprint(mlp(32))  # a wider layer
    assert fingerprint(a) != fingerprint(nn.Sequential(nn.Linear(8, 16), nn.GELU(), nn.Linear(16, 4)))  # a class


def test_a_new_workbench_says_what_it_reloaded(make_bench, capsys):
    first = make_bench(mlp())
    capsys.readouterr()
    first.run(progress=False)
    first.run(batch_size=16, progress=False)
    assert "Reloaded" not in "".join(capsys.readouterr())  # an empty log: nothing to say
    again = make_bench(mlp())
    said = "".join(capsys.readouterr())
    assert said.count("Reloaded 2 trials from") == 1 and str(first.log.path) in said
    assert "baseline is trial #1 (defaults" in said and "another model" not in said
    assert again.baseline.trial_id == 1


def test_an_edited_model_starts_a_new_baseline_and_keeps_the_old_rows(make_bench, capsys):
    old = make_bench(mlp())
    a, b = old.run(progress=False), old.run(batch_size=16, progress=False)
    old.run(progress=False)  # a repeat: noise evidence of the old model
    old.baseline = b  # an explicit baseline of the old model
    prior = type(old.log)(None).noise
    assert old.log.noise != prior
    capsys.readouterr()
    new = make_bench(mlp(32))  # the user widened a layer
    said = "".join(capsys.readouterr())
    assert "3 of them measured another model" in said and "first ok trial becomes the baseline" in said
    assert new.baseline is None
    c = new.run(progress=False)
    d = new.run(batch_size=16, progress=False)
    assert new.baseline.trial_id == c.trial_id
    df = new.results.set_index("trial_id")
    assert list(df.index) == [1, 2, 3, c.trial_id, d.trial_id]  # every trial stays in the table
    assert df.loc[[a.trial_id, b.trial_id], "speedup"].isna().all()
    assert (df.loc[[a.trial_id, b.trial_id], "verdict"] == "").all()
    assert df.loc[a.trial_id, "model"] != df.loc[c.trial_id, "model"] == new.fingerprint
    assert df.loc[c.trial_id, "verdict"] == "baseline" and df.loc[d.trial_id, "verdict"] != ""
    # d's verdict rests on this model's trials alone: one trial each side, not the old model's repeats
    assert new.log.noise == prior  # no repeat of this model yet: the old model's repeats do not count


def test_a_log_written_without_fingerprints_is_another_model(make_bench, capsys):
    bench = make_bench(mlp())
    bench.run(progress=False)
    path = bench.log.path
    lines = [json.loads(line) for line in path.read_text().splitlines()]
    for rec in lines:
        rec.get("extra", {}).pop("model", None)
    path.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    capsys.readouterr()
    again = make_bench(mlp())
    assert "an older workbench wrote them without a model fingerprint" in "".join(capsys.readouterr())
    assert again.baseline is None and wb.Knobs  # never compared with the model that has a fingerprint
