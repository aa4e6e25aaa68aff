"""Feeds run several at a time (runtime/session.py's ``in_order``): results come back in their order, however the
runs finish; no more than ``workers`` run ahead of the consumer; a run's error reaches the consumer; a consumer that
stops early leaves nothing running. Measurements made this way equal one-at-a-time ones."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

from trt_bridge.calibrate.session import CalibrationSession
from trt_bridge.runtime import session as runtime_session
from trt_bridge.runtime.session import cores, feed_workers, in_order
from trt_bridge.samples import conv_net, image_feeds


def test_results_come_back_in_order_whatever_finishes_first():
    def run(i):
        time.sleep(0.02 if i % 2 == 0 else 0.0)  # even items finish last
        return i * i
    got = [(item, job.result()) for item, job in in_order(run, range(9), workers=3)]
    assert got == [(i, i * i) for i in range(9)]


def test_no_more_than_workers_run_ahead_of_the_consumer():
    started, lock = [], threading.Lock()

    def run(i):
        with lock:
            started.append(i)
        return i

    for item, job in in_order(run, range(10), workers=2):
        job.result()
        time.sleep(0.01)  # the workers have long finished what they were given
        with lock:
            assert max(started) <= item + 2, (item, started)


def test_an_error_reaches_the_consumer_and_early_stop_starts_nothing_more():
    calls = []

    def run(i):
        calls.append(i)
        if i == 3:
            raise ValueError("feed 3 is bad")
        return i

    seen = []
    with pytest.raises(ValueError, match="feed 3 is bad"):
        for _, job in in_order(run, range(100), workers=2):
            seen.append(job.result())
    assert seen == [0, 1, 2]
    time.sleep(0.05)
    assert max(calls) <= 3 + 2  # the generator was closed: nothing beyond what was already submitted ran


def test_workers_share_out_the_cores(monkeypatch):
    monkeypatch.setattr(runtime_session, "cores", lambda: 1)
    assert feed_workers() == 1
    monkeypatch.setattr(runtime_session, "cores", lambda: 16)
    assert feed_workers() == 2
    assert cores() >= 1


def test_several_feeds_at_once_give_what_one_at_a_time_gives():
    model = conv_net(channels=(8, 16))
    feeds = [{"x": f} for f in image_feeds(7, seed=3)]
    names = [o.name for o in model.graph.output]
    with CalibrationSession(model, [], simulate_qdq=True) as session:
        together = [values for _, values in session.outputs(names, feeds)]
        alone = [session.session.run(names, feed) for feed in feeds]
    assert len(together) == len(feeds)
    for a, b in zip(together, alone):
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
