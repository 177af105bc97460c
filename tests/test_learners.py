"""Learners: what one learner runs into the shared folder, and a class of them simulated as processes."""

from __future__ import annotations

import pytest

from workbench.faces.learners import TRIALS, SimulatedLearners, learner_session, simulate_learners
from workbench.faces.workshop import gather


def test_learner_session_runs_the_prescribed_trials_into_the_shared_folder(tmp_path):
    bench = learner_session(tmp_path, "ana", demo="jpeg", size="tiny", steps=2, warmup_steps=0)
    assert bench.log.path == tmp_path / "ana" / "demo-jpeg.jsonl"
    assert [r.knobs for r in bench.trials] == [bench.knobs(**k) for k in TRIALS]
    ws = gather(tmp_path)
    assert ws.participants == ["ana"] and len(ws.summary()) == len(TRIALS) - 1


def test_the_workshop_module_still_exports_the_learner_names():
    import workbench.faces.workshop as workshop

    assert (workshop.TRIALS, workshop.learner_session, workshop.simulate_learners, workshop.SimulatedLearners) == \
        (TRIALS, learner_session, simulate_learners, SimulatedLearners)


def test_a_failing_learner_process_is_named_with_its_error(tmp_path):
    """A learner whose session fails (an unknown demo) ends non-zero; wait() names it and its error."""
    class_ = simulate_learners(tmp_path, ["ana"], demo="no-such-demo")
    assert isinstance(class_, SimulatedLearners)
    with pytest.raises(RuntimeError, match=r"(?s)learner 'ana' exited with 1: .*unknown demo 'no-such-demo'"):
        class_.wait(timeout=300)
    assert class_.running == 0
    class_.stop()  # nothing left to stop: a no-op
