"""panel/queue.py: the trial queue without any widget: debounce, latest wins, stop, errors."""

from __future__ import annotations

import threading
import time

import pytest

from workbench.faces.panel.queue import TrialQueue


def test_a_burst_of_jobs_runs_once_with_the_latest():
    ran = []
    q = TrialQueue(ran.append, debounce_s=0.2)
    try:
        for job in (1, 2, 3):
            q.put(job)
        assert q.busy and q.wait(10)
        assert ran == [3]
    finally:
        q.close()


def test_jobs_put_during_a_run_coalesce_and_run_after_it():
    gate, started, ran = threading.Event(), threading.Event(), []

    def handler(job):
        ran.append(job)
        if job == "first":
            started.set()
            gate.wait(10)

    q = TrialQueue(handler, debounce_s=0.0)
    try:
        q.put("first")
        assert started.wait(10)
        q.put("a")
        q.put("b")
        assert q.running
        gate.set()
        assert q.wait(10) and ran == ["first", "b"]
    finally:
        q.close()


def test_stop_drops_the_queued_job_and_cancels_the_running_one():
    started, ran = threading.Event(), []

    def handler(job):
        ran.append(job)
        if job == "long":
            started.set()
            assert q.cancel.wait(10)  # a trial checks this at every step boundary

    q = TrialQueue(handler, debounce_s=0.0)
    try:
        q.put("long")
        assert started.wait(10)
        q.put("queued", debounce=True)
        assert q.stop() is True
        assert q.wait(10) and ran == ["long"]
        q.put("next", debounce=False)  # cancel is cleared for the next job
        assert q.wait(10) and ran == ["long", "next"]
    finally:
        q.close()


def test_a_failing_handler_reports_and_the_queue_keeps_serving():
    errors, ran = [], []

    def handler(job):
        if job == "bad":
            raise RuntimeError("boom")
        ran.append(job)

    q = TrialQueue(handler, debounce_s=0.0, on_error=errors.append)
    try:
        q.put("bad")
        assert q.wait(10)
        q.put("good")
        assert q.wait(10)
        assert [str(e) for e in errors] == ["boom"] and ran == ["good"]
    finally:
        q.close()


def test_close_ends_the_thread_and_wait_times_out():
    q = TrialQueue(lambda job: time.sleep(0.5), debounce_s=0.0)
    q.put(1)
    assert q.wait(0.01) is False
    q.close()
    q.thread.join(10)
    assert not q.thread.is_alive()
    with pytest.raises(ValueError):
        TrialQueue(print, debounce_s=-1)
