"""rounds.compare: the driver that runs alternating rounds of trials, then hands them to the deciders.

The statistics of the rounds (false alarms, power, peeking) are tested in test_stats.py; here, what
the driver does: which trials it runs in which order, when it stops, and what it refuses.
"""

import pytest
from fake_trials import fake, noisy

from workbench.core.knobs import Knobs
from workbench.deciding.rounds import compare
from workbench.results.comparison import judge
from workbench.results.log import ResultLog

FAST = Knobs(num_workers=1)


class Runner:
    """run(knobs) that logs a fake trial: the default knobs take 10 ms a step, FAST 5 ms (exactly)."""

    def __init__(self, fail_at: int | None = None) -> None:
        self.log, self.order, self.fail_at = ResultLog(None), [], fail_at

    def __call__(self, knobs: Knobs):
        self.order.append("B" if knobs == FAST else "A")
        if self.fail_at is not None and len(self.order) == self.fail_at:
            return self.log.append(fake([0.01, 0.01], status="oom", **knobs.to_dict()))
        step = 0.005 if knobs == FAST else 0.010
        return self.log.append(fake(noisy(step, 0.001, seed=len(self.order)), **knobs.to_dict()))


def test_zero_rounds_runs_nothing_and_is_judge():
    run = Runner()
    a, b = run(Knobs()), run(FAST)
    c = compare(a, b, run=run, log=run.log)
    assert run.order == ["A", "B"] and c == judge(a, b, log=run.log)


def test_rounds_alternate_b_a_then_a_b_and_count():
    run = Runner()
    a, b = run(Knobs()), run(FAST)
    c = compare(a, b, rounds=2, run=run, log=run.log)
    assert run.order == ["A", "B", "B", "A", "A", "B"]
    assert c.rounds == 2 and len(c.a_trials) == len(c.b_trials) == 3 and c.answer == "faster"
    assert c.seconds is not None and c.noise == run.log.noise  # the log, re-read after the rounds


def test_a_failed_round_stops_and_decides_on_the_complete_ones():
    run = Runner(fail_at=5)  # A B, then round 1 (B A), then round 2's first trial ends "oom"
    a, b = run(Knobs()), run(FAST)
    c = compare(a, b, rounds=3, run=run, log=run.log)
    assert c.rounds == 1 and len(c.a_trials) == 2 and "Round 2" in c.note and "1 complete round." in c.note


def test_auto_stops_as_soon_as_it_is_decided():
    run = Runner()
    a, b = run(Knobs()), run(FAST)
    c = compare(a, b, rounds="auto", run=run, log=run.log, max_rounds=8)
    assert c.answer == "faster" and c.max_rounds == 8 and 1 <= c.rounds < 8
    assert len(run.order) == 2 + 2 * c.rounds


def test_auto_without_a_back_to_back_pair_rests_on_the_new_rounds():
    run = Runner()
    a = run(Knobs())
    run(Knobs())  # a trial between them: #1 and #3 did not run back to back
    b = run(FAST)
    c = compare(a, b, rounds="auto", run=run, log=run.log, max_rounds=4)
    assert "did not run back to back" in c.note and a.trial_id not in c.a_trials


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"rounds": -1}, "rounds must be"), ({"rounds": True}, "rounds must be"), ({"rounds": 2, "run": None}, "a way to run"),
    ({"rounds": "auto", "run": None}, "a way to run"), ({"rounds": "auto", "max_rounds": 0}, "max_rounds"),
    ({"rounds": "auto", "budget_s": 0}, "budget_s"), ({"margin": 1.5}, "margin"),
])
def test_bad_arguments_are_refused_before_any_trial_runs(kwargs, match):
    run = Runner()
    a, b = run(Knobs()), run(FAST)
    with pytest.raises(ValueError, match=match):
        compare(a, b, **{"run": run, **kwargs})
    assert run.order == ["A", "B"]
