"""New input shapes are warm-up, reported, and a knob's business (issue 48, item 2).

The stand-in for a GPU's plan cache: a model whose first call on each input shape in this process
sleeps FIRST_S (cuBLAS/cuDNN plans, autotune, graph capture, recompiles behave alike), and whose every
call sleeps STEP_S (the device's compute: a sleep holds under load on a shared 2-core machine). What
stays unverified here: the size of a real GPU's per-shape cost (benchmarks/gpu_check.py measures it).
"""

from __future__ import annotations

import random
import time

import pytest
import torch
from torch import nn
from torch.nn import functional as F
from torch.utils.data import DataLoader, Dataset

import workbench as wb
from workbench.core.earlystop import StopRule
from workbench.core.shapes import ShapeWatch, costly, shape_costs, signature
from workbench.core.steady import WarmupRule

FIRST_S = 0.04  # a new shape's first call
STEP_S = 0.025  # every call (long enough that a scheduling hiccup under load is a small share)
SEEN: set[tuple[int, ...]] = set()  # the process's plan cache


class PlanCached(nn.Module):
    """Embedding + linear LM head; the first call on an input_ids shape costs FIRST_S, once per process."""

    def __init__(self, vocab: int = 32, dim: int = 16) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, input_ids, labels, attention_mask=None):
        if tuple(input_ids.shape) not in SEEN:
            SEEN.add(tuple(input_ids.shape))
            time.sleep(FIRST_S)
        time.sleep(STEP_S)
        logits = self.head(self.emb(input_ids))
        return F.cross_entropy(logits.flatten(0, 1), labels.flatten(), ignore_index=-100)


class Skewed(Dataset):
    """Token dicts of Pareto lengths (most short, a few long): the padding problem."""

    def __init__(self, n: int = 192, seed: int = 0) -> None:
        rng = random.Random(seed)
        self.items = [torch.randint(1, 32, (min(48, max(2, int(4 * rng.paretovariate(1.3)))),),
                                    generator=torch.Generator().manual_seed(i)) for i in range(n)]

    def __len__(self) -> int:
        return len(self.items)

    def __getitem__(self, i: int):
        return {"input_ids": self.items[i], "labels": self.items[i]}


def pad_longest(features):
    """Pad each batch to its longest sample (a tokenizer's padding='longest'): one shape per length."""
    width = max(len(f["input_ids"]) for f in features)
    ids = torch.zeros(len(features), width, dtype=torch.long)
    labels = torch.full((len(features), width), -100)
    mask = torch.zeros(len(features), width, dtype=torch.long)
    for row, f in enumerate(features):
        n = len(f["input_ids"])
        ids[row, :n], labels[row, :n], mask[row, :n] = f["input_ids"], f["labels"], 1
    return {"input_ids": ids, "labels": labels, "attention_mask": mask}


def token_bench(**kw):
    torch.manual_seed(0)
    kw.setdefault("steps", 12)
    kw.setdefault("warmup_steps", 3)
    return wb.Workbench(PlanCached(), DataLoader(Skewed(), batch_size=8, collate_fn=pad_longest), log=None,
                        device="cpu", optimizer=lambda p: torch.optim.SGD(p, lr=0.1), **kw)


@pytest.fixture(autouse=True)
def fresh_cache():
    SEEN.clear()
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


def bare_loop_tokens_per_s() -> float:
    """A hand-written loop over every batch of the data, timed on its second pass (every shape seen)."""
    model = PlanCached()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    batches = list(DataLoader(Skewed(), batch_size=8, collate_fn=pad_longest))
    for _pass in ("first calls", "timed"):
        t0, tokens = time.perf_counter(), 0
        for b in batches:
            model(**b).backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            tokens += int(b["attention_mask"].sum())
        wall = time.perf_counter() - t0
    return tokens / wall


def test_shapes_are_warmed_up_reported_and_two_trials_agree_with_a_bare_loop():
    """The held-out acceptance test: a step whose first call on each shape costs extra, on skewed lengths."""
    bench = token_bench()
    first = bench.run()
    again = bench.run()  # the process has seen every shape now
    assert first.ok and again.ok, (first.message, again.message)
    info = first.extra["shapes"]
    assert first.shapes == info["distinct"] >= 4, info
    assert info["pass_batches"] >= 4 and info["in_window"] == 0 and again.extra["shapes"]["in_window"] == 0
    assert first.extra["warmup_rule"]["steps"] >= info["pass_batches"]  # one pass over the repeated sample
    assert "every input shape" in first.extra["warmup_rule"]["reason"]
    assert FIRST_S / 2 <= info["per_shape_s"] <= 3 * FIRST_S, info  # the first calls' cost, apart from the window
    assert first.shape_warmup_s == pytest.approx(info["per_shape_s"] * first.shapes)
    assert again.shape_warmup_s is None or again.shape_warmup_s < first.shape_warmup_s / 2  # the cache is the process's
    assert first.steady and again.steady
    ratio = again.tokens_per_s / first.tokens_per_s
    assert 1 / 1.2 <= ratio <= 1.2, ratio  # identical knobs agree, seen or not
    bare = bare_loop_tokens_per_s()
    assert 1 / 1.25 <= first.tokens_per_s / bare <= 1.25, (first.tokens_per_s, bare)
    table = bench.results
    assert {"shapes", "shape_warmup_s"} <= set(table.columns) and table["shapes"].tolist() == [first.shapes] * 2

    d = bench.diagnose(profile=False, memory=False, flops=False, loader=False)
    lines = d.analyses["input shapes"].lines
    assert d.analyses["input shapes"].per_shape_s == info["per_shape_s"]  # the trial that paid: the first
    text = str(d)
    assert f"{first.shapes} input shapes x" in lines[0] and "ms" in lines[0], lines
    assert "once per distinct shape in your data" in lines[1]
    assert "pad_to_multiple_of=" in lines[-1] and "New input shapes" in text
    assert d.analyses["input shapes"].offer["pad_to_multiple_of"] in (8, 16, 32, 64, 128)


def test_a_fixed_shape_workload_warms_up_exactly_as_before():
    """Same-length samples: one shape, no pass added, nothing to report as a shape cost."""
    class Same(Skewed):
        def __getitem__(self, i):
            x = self.items[0]
            return {"input_ids": x, "labels": x}

    torch.manual_seed(0)
    bench = wb.Workbench(PlanCached(), DataLoader(Same(), batch_size=8, collate_fn=pad_longest), log=None,
                         device="cpu", optimizer=lambda p: torch.optim.SGD(p, lr=0.1), steps=6, warmup_steps=3)
    r = bench.run()
    assert r.ok and r.shapes == 1 and r.shape_warmup_s is None
    rule = r.extra["warmup_rule"]
    assert rule["sample_batches"] == 0 and "every input shape" not in rule["reason"]
    plain = WarmupRule(min_steps=3)
    for t in [1.0] + [0.01] * 20:
        plain.observe(t)
        if plain.done():
            break
    assert rule["steps"] == plain.steps  # no slow step but the first, no trend: what the rule took before


def test_the_rule_reads_the_whole_repeated_sample_once_shapes_vary():
    rule = WarmupRule(min_steps=2, sample_batches=10)
    for i in range(30):
        rule.observe(0.01, shapes=min(i + 1, 3), batches=i + 1, new_shapes=1 if i < 3 else 0)
        if rule.done():
            break
    assert rule.batches_read >= 10 and rule.ended == "steady"
    assert "first call on 1 new input shape" in rule.outcome()["slow_steps"]["3"]
    one = WarmupRule(min_steps=2, sample_batches=10)  # one shape so far: no pass
    for i in range(30):
        one.observe(0.01, shapes=1, batches=i + 1)
        if one.done():
            break
    assert one.steps < 10
    fixed = WarmupRule(min_steps=2, sample_batches=10, fixed=True)
    fixed.observe(0.01, shapes=2, batches=1)
    fixed.observe(0.01, shapes=3, batches=2)
    assert fixed.done() and fixed.steps == 2  # WORKBENCH_FIXED_WARMUP keeps its exact count


def test_signature_and_watch_count_first_seen_shapes():
    assert signature({"a": torch.ones(2, 3), "b": (torch.ones(4), 1)}) == (("a", (2, 3)), ("b", ((4,), None)))

    class Source:
        loader = None

        def __init__(self):
            self.widths = iter([3, 3, 5, 3, 7])

        def next(self):
            return torch.ones(2, next(self.widths))

    w = ShapeWatch(Source())
    w.next()
    assert w.since(0) == ((0,), 1)
    for _ in range(3):
        w.next()
    assert w.since(1) == ((0, 1, 0), 1) and w.distinct == 2 and w.read == 4 and w.sample_batches == 0


def test_shape_costs_is_the_first_calls_time_over_the_same_shapes_steady_time():
    warm = [(0.05, (1,), 1), (0.06, (2,), 1), (0.01, (1,), 0)]
    window = [(0.01, (1,)), (0.02, (2,)), (0.01, (0,))]
    c = shape_costs(warm, window, distinct=3)
    assert c["measured"] == 2 and c["per_shape_s"] == pytest.approx((0.04 + 0.04) / 2)
    assert c["warmup_s"] == pytest.approx(0.12) and costly(c, 0.01) and not costly(c, 0.03)
    assert shape_costs(warm, window, distinct=1)["per_shape_s"] is None  # one shape: start-up holds it


def test_the_early_stop_never_judges_a_first_seen_shape_step():
    rule = StopRule([0.01] * 10, steps=12)
    assert not any(rule.observe(10.0, 1, first_seen=True) for _ in range(8))  # 1000x slower, but first calls
    assert rule.stopped_at is None and rule.times == []
    slow = StopRule([0.01] * 10, steps=12)
    assert any(slow.observe(10.0, 1) for _ in range(8))  # the same steps, judged: stopped


def test_tune_enters_pad_to_multiple_of_first_when_first_calls_are_costly():
    from types import SimpleNamespace

    from workbench.core.measure import TrialResult
    from workbench.search.tune import _lead, stage_axes

    bench = token_bench()
    k = bench.defaults

    def logged(per_shape_s):
        return bench.log.append(TrialResult(knobs=k, status="ok", samples_per_s=100.0, step_times_s=(0.01,) * 4,
                                            samples_per_step=8, shapes=9, shape_warmup_s=9 * per_shape_s,
                                            extra={"shapes": {"distinct": 9, "per_shape_s": per_shape_s}}))

    cheap = logged(0.005)  # half a step per shape: not worth a knob of its own
    assert dict(stage_axes(bench, "data", k))["pad"] == [{"pad_to_multiple_of": 8}]
    assert _lead(SimpleNamespace(bench=bench, rows=[]), cheap) == ()
    dear = logged(0.18)  # 18 steps per shape (the H200's plan cost, issue 48)
    assert dict(stage_axes(bench, "data", k))["pad"][0] == {"pad_to_multiple_of": 64}
    ctx = SimpleNamespace(bench=bench, rows=[])
    assert _lead(ctx, dear) == ("pad",) and "9 input shapes cost ≈180 ms" in ctx.rows[0]["decision"]


def test_interleaved_sides_warm_one_pass_over_prepared_batches_whose_shapes_vary(monkeypatch):
    from types import SimpleNamespace

    from workbench.deciding import interleave

    turns: list[tuple[str, int]] = []
    monkeypatch.setattr(interleave, "_checked", lambda side, run, pairs: run())
    monkeypatch.setattr(interleave, "_turn", lambda side, steps, lead_in: turns.append((side.name, steps)) or 1.0)
    monkeypatch.setattr(interleave, "WARMUP_S", 0.0)

    def side(name, widths, accum=1):
        batches = [{"input_ids": torch.zeros(8, w, dtype=torch.long)} for w in widths]
        return SimpleNamespace(name=name, knobs=wb.Knobs(accum_steps=accum), replay=interleave.Replay(batches))

    interleave._warm([side("varied", [3, 5, 7, 9, 11, 13, 15, 17]), side("fixed", [4] * 8),
                      side("accum", [3, 5, 7, 9, 11, 13, 15, 17], accum=2)], warmup_steps=3)
    first = {name: steps for name, steps in turns[:3]}
    assert first == {"varied": 8, "fixed": 3, "accum": 4}  # one pass when shapes vary; as before when not


def test_the_shape_columns_go_through_the_log_and_bad_values_are_refused():
    import json

    from workbench.core.measure import TrialResult
    from workbench.results.records import BadRecord, parse_record

    r = TrialResult(knobs=wb.Knobs(), status="ok", samples_per_s=10.0, step_times_s=(0.1,), trial_id=1, shapes=7,
                    shape_warmup_s=0.28)
    kind, back = parse_record(json.dumps(r.to_record()))
    assert kind == "trial" and (back.shapes, back.shape_warmup_s) == (7, 0.28)
    old = {k: v for k, v in r.to_record().items() if k not in ("shapes", "shape_warmup_s")}  # a log from before
    assert parse_record(json.dumps(old))[1].shapes is None
    for bad in ({"shapes": -1}, {"shapes": 2.5}, {"shape_warmup_s": "slow"}):
        with pytest.raises(BadRecord, match="shape"):
            parse_record(json.dumps({**r.to_record(), **bad}))


def test_the_exported_script_warms_up_over_the_shapes_and_its_window_meets_none(capsys):
    """What we export is what we measured: the script of a trial whose shapes varied repeats a sample one
    timed window long, read once in warm-up, and says how many shapes its window met first (none)."""
    bench = token_bench()
    r = bench.run(progress=False)
    assert r.ok and r.shapes > 1 and r.extra["shapes"]["pass_batches"] > 0, r.extra.get("shapes")
    code = bench.to_code(r, steps=24)
    assert code == r.to_code(steps=24, seed=bench.workload.seed)  # the trial's own export says the same
    torch.manual_seed(0)
    ns = {"model": PlanCached(), "dataset": Skewed(), "collate_fn": pad_longest, "__name__": "__exported__",
          "make_optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
    exec(compile(code, "<exported>", "exec"), ns)
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    met = ns["shapes"]
    assert len(met) > 1 and f"{len(met)} input shapes, 0 first seen in the timed window" in summary, summary
    assert ns["new_in_window"] == 0 and ns["warmup_steps"] >= ns["num_steps"] - ns["warmup_steps"]
    fixed = wb.Knobs(batch_size=8)
    assert wb.Knobs.to_code(fixed, shapes={"distinct": 1, "pass_batches": 12}) == fixed.to_code()  # one shape: as before
    plain = fixed.to_code(shapes={"distinct": 5})  # varied, no repeated sample (iterable data): timed apart
    assert "batch_sampler" not in plain and "first_s, t0, seen0 = first_s + spent" in plain


def test_diagnose_next_knobs_offer_pad_to_multiple_of_when_first_calls_are_costly(monkeypatch):
    """A first call costing ~5 steady steps per shape: the verdict's next knobs hold the shapes section's
    pad_to_multiple_of, with the measured cost in its evidence."""
    import sys

    monkeypatch.setattr(sys.modules[__name__], "FIRST_S", 0.12)
    bench = token_bench()
    r = bench.run(progress=False)
    assert r.ok and costly(r.extra["shapes"], r.step_time_s), (r.extra["shapes"], r.step_time_s)
    d = bench.diagnose(profile=False, memory=False, flops=False, loader=False)
    section = d.analyses["input shapes"]
    m = section.offer["pad_to_multiple_of"]
    assert d.next_knobs["pad_to_multiple_of"] == m, str(d.verdict)
    shown = f"{section.shapes} input shapes x {section.per_shape_s * 1e3:,.0f} ms"
    assert any(shown in e for e in d.verdict.evidence), d.verdict.evidence
    assert f"pad_to_multiple_of={m} leaves" in d.verdict.why and f"pad_to_multiple_of={m!r}" in str(d.verdict)


def test_the_verdict_keeps_its_knobs_when_first_calls_are_cheap_and_says_bucketing_without_an_offer():
    from types import SimpleNamespace

    from workbench.core.measure import TrialResult
    from workbench.diagnose.verdict import Verdict, with_shape_cost

    base = TrialResult(knobs=wb.Knobs(), status="ok", samples_per_s=100.0, step_times_s=(0.01,) * 4)
    v = Verdict("compute", "the step itself", ("MFU 3%",), {"amp": "bf16"}, "tensor units")
    cheap = SimpleNamespace(shapes=9, per_shape_s=0.015, offer={"pad_to_multiple_of": 16}, options=None)
    assert with_shape_cost(v, cheap, base) == v and with_shape_cost(v, None, base) == v  # 1.5 steps: not costly
    dear = SimpleNamespace(shapes=9, per_shape_s=0.18, offer={}, options=None)  # not token data: no knob to offer
    out = with_shape_cost(v, dear, base)
    assert out.next_knobs == {"amp": "bf16"} and "bucketing" in out.why and "9 input shapes x 180 ms" in out.evidence[-1]
    pad = SimpleNamespace(shapes=9, per_shape_s=0.18, offer={"pad_to_multiple_of": 64}, options=None)
    assert with_shape_cost(v, pad, base).next_knobs == {"amp": "bf16", "pad_to_multiple_of": 64}
    padded = TrialResult(knobs=wb.Knobs(pad_to_multiple_of=64), status="ok", samples_per_s=100.0,
                         step_times_s=(0.01,) * 4)  # already padded to it: not offered again, bucketing said
    again = with_shape_cost(v, pad, padded)
    assert "pad_to_multiple_of" not in again.next_knobs and "bucketing" in again.why


def test_without_a_repeated_sample_the_scripts_window_times_first_calls_apart(capsys):
    """Varied shapes the script cannot repeat (no sample recorded): the steps of its window that meet a new
    shape leave the figure, their seconds said apart (each holds one FIRST_S sleep at least)."""
    bench = token_bench()
    code = bench.to_code(wb.Knobs(batch_size=8), shapes={"distinct": 9}, steps=20)
    assert "batch_sampler" not in code
    torch.manual_seed(0)
    ns = {"model": PlanCached(), "dataset": Skewed(), "collate_fn": pad_longest, "__name__": "__exported__",
          "make_optimizer": lambda p: torch.optim.SGD(p, lr=0.1)}
    exec(compile(code, "<exported>", "exec"), ns)
    summary = capsys.readouterr().out.strip().splitlines()[-1]
    assert ns["new_in_window"] > 0 and ns["first_s"] >= FIRST_S, (ns["new_in_window"], ns["first_s"])
    assert f"{ns['new_in_window']} first seen in the timed window ({ns['first_s']:.2f} s one-time, left out)" in summary
    timed = ns["num_steps"] - ns["warmup_steps"] - ns["left_out"]
    assert 0 < ns["left_out"] <= ns["new_in_window"] and f"over {timed} timed steps" in summary, summary
