"""Log lines as untrusted input: every bad line skipped with one warning, never its content."""

import json
import math

import pytest
from fake_trials import fake
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import workbench as wb
from workbench.core.measure import STATUSES, TrialResult
from workbench.results.log import ResultLog
from workbench.results.records import BadRecord, parse_record, read_records

# ---- untrusted content: every bad line skipped with one warning, never its content ---------------
SECRET = "TOPSECRET-do-not-echo"


def hostile_lines(good: dict) -> list[bytes]:
    """One line of each kind a reader must survive (good records between them)."""
    inf = {**good, "samples_per_s": 1e400, "message": SECRET}
    negative = {**good, "batch_size": -5, "message": SECRET}
    neg_rate = {**good, "samples_per_s": -3.0, "message": SECRET}
    wrong = {**good, "step_times_s": SECRET}
    return [
        b"[" * 100_000 + SECRET.encode(),  # deep nesting (RecursionError in json before)
        b'{"x": "' + SECRET.encode() * 100_000 + b'"}',  # a huge line
        json.dumps(inf).replace("Infinity", "1e400").encode(),
        json.dumps({**good, "samples_per_s": float("nan"), "message": SECRET}).encode(),  # NaN literal
        json.dumps(negative).encode(),
        json.dumps(neg_rate).encode(),
        json.dumps(wrong).encode(),
        bytes(range(256)) + SECRET.encode(),  # binary garbage
        json.dumps([SECRET]).encode(),
        json.dumps({**good, "trial_id": True}).encode(),
        json.dumps({**good, "amp": SECRET}).encode(),  # a knob failing validation
    ]


def test_hostile_log_lines_are_skipped_with_one_warning_naming_the_lines(tmp_path):
    good = ResultLog(None).append(fake([0.01, 0.011, 0.012]))
    rec = json.loads(json.dumps(good.to_record()))
    path = tmp_path / "log.jsonl"
    lines = [json.dumps(rec).encode(), *hostile_lines(rec), json.dumps({**rec, "trial_id": 2}).encode()]
    path.write_bytes(b"\n".join(lines) + b"\n")
    with pytest.warns(UserWarning) as caught:
        log = ResultLog(path)
    assert [r.trial_id for r in log.trials] == [1, 2]
    text = " ".join(str(w.message) for w in caught)
    assert len(caught) == 1 and "log.jsonl" in text and "line 2 (" in text and "12 unreadable" in text  # the garbage holds a newline: two lines
    assert SECRET not in text and "\\x" not in text
    assert log.append(fake([0.01, 0.01])).trial_id == 3  # the log stays usable


def test_parse_record_rejects_deep_nesting_before_parsing():
    with pytest.raises(BadRecord, match="nested deeper"):
        parse_record("[" * 200 + "]" * 200)
    with pytest.raises(BadRecord, match="longer than"):
        parse_record("1" * (2 << 20))
    assert parse_record('{"event": "baseline", "trial_id": 3}') == ("baseline", 3)
    with pytest.raises(BadRecord):  # brackets inside strings do not count, but the record is foreign
        parse_record(json.dumps({"message": "[" * 100}))


JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=12), inner, max_size=4),
                    max_leaves=30)


FIELDS = ["status", "trial_id", "samples_per_s", "step_times_s", "batch_size", "amp", "losses", "env", "notes",
          "peak_memory_bytes", "checkpoint", "event", "participant"]


RECORDS = st.dictionaries(st.sampled_from(FIELDS), JSON, max_size=8)  # near-misses of a real record


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.binary(max_size=300) | RECORDS.map(lambda d: json.dumps(d).encode()), max_size=6))
def test_reading_arbitrary_lines_never_raises(tmp_path, chunks):
    import warnings as w

    trials, _, _ = read_records(b"\n".join(chunks).split(b"\n"))
    assert all(isinstance(r.samples_per_s, (float, int, type(None))) for r in trials)
    path = tmp_path / "fuzz.jsonl"
    path.write_bytes(b"\n".join(chunks))
    with w.catch_warnings(record=True) as caught:
        w.simplefilter("always")
        log = ResultLog(path)
    assert all(issubclass(c.category, UserWarning) for c in caught)  # the documented warning only
    log.frame()  # whatever was accepted can be tabled


@settings(max_examples=150, deadline=None)
@given(JSON)
def test_parse_record_of_arbitrary_json_raises_only_bad_record(value):
    """Whatever it accepts is a valid record: a baseline id >= 1, or a trial whose figures are finite and
    >= 0 and whose knobs pass validation again (a check that let a bad value through fails here)."""
    try:
        kind, got = parse_record(json.dumps(value))
    except BadRecord:
        return
    if kind == "baseline":
        assert type(got) is int and got >= 1
        return
    assert kind == "trial" and isinstance(got, TrialResult), kind
    assert type(got.trial_id) is int and got.trial_id >= 1 and got.status in STATUSES
    figures = [got.samples_per_s, got.startup_s, got.compile_s, got.data_wait_share, *got.step_times_s,
               *got.data_wait_s]
    assert all(math.isfinite(x) and x >= 0 for x in figures if x is not None), figures
    assert wb.Knobs.from_dict(got.knobs.to_dict(), keep_unknown=True) == got.knobs


def test_a_comparison_logged_before_round_5_reads_its_blocks_as_turns(tmp_path):
    """Logs written before "turns" named the interleaved runs of steps kept them as blocks/block_steps."""
    side = {**wb.Knobs().to_dict(), "user_knobs": []}
    old = {"event": "comparison", "a": 1, "b": 2, "a_knobs": side, "b_knobs": {**side, "channels_last": True},
           "method": "interleaved", "answer": "faster", "speedup": 1.2, "low": 1.1, "high": 1.3, "margin": 0.05,
           "seconds": 3.0, "blocks": 40, "block_steps": 4, "rounds": 0, "note": "", "at": ""}
    kind, c = parse_record(json.dumps(old))
    assert kind == "comparison" and (c.turns, c.turn_steps) == (40, 4) and c.how.startswith("interleaved, 40 pairs of turns")
    again = c.to_record()
    assert (again["turns"], again["turn_steps"]) == (40, 4) and "blocks" not in again
