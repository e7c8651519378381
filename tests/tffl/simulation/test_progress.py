"""tffl.simulation.driver: each round line shows the elapsed time and the remaining rounds' ETA."""

import re

import numpy as np
import tensorflow as tf

from tffl.simulation import driver
from tffl.simulation import metrics_log
from tffl.simulation import participation


class _Process:
    def initialize(self):
        return {"t": np.int64(0)}

    def next(self, state, datasets):
        del datasets
        return {"t": state["t"] + 1}, {"client_work": {"train": {"loss": 0.69}}}


def _data(cid, round_num):
    del cid
    return tf.data.Dataset.from_tensor_slices(np.array([[round_num]], np.float32))


def _lines(output_dir, rounds, resume=False):
    lines = []
    driver.run_rounds(
        _Process(), participation.FullParticipation(["a"]), _data, rounds, output_dir,
        driver.RunOptions(resume=resume, log=lines.append, tensorboard=False))
    return [line for line in lines if line.startswith("round")]


def test_round_lines_end_with_elapsed_time_and_eta(tmp_path):
    lines = _lines(tmp_path, 3)
    timing = r"  \d+\.\d s elapsed"
    assert all(re.search(timing + r", ETA \d+\.\d s$", line) for line in lines[:2]), lines
    assert re.search(timing + "$", lines[2]), lines   # no ETA after the last round
    # A resumed run counts its own rounds only.
    assert re.search(timing + r", ETA \d+\.\d s$", _lines(tmp_path, 5, resume=True)[0])


def test_the_eta_is_the_mean_round_time_times_the_rounds_left(monkeypatch):
    now = [100.0]
    monkeypatch.setattr(metrics_log.time, "perf_counter", lambda: now[0])
    clock = metrics_log.RoundClock(started=40.0)   # 60 s of setup before the first round
    now[0] = 110.0
    assert clock.tick(rounds_left=9) == "1 min 10 s elapsed, ETA 1 min 30 s"
    now[0] = 130.0
    assert clock.tick(rounds_left=8) == "1 min 30 s elapsed, ETA 2 min 00 s"
    assert clock.tick(rounds_left=0) == "1 min 30 s elapsed"


def test_durations_are_compact():
    assert [metrics_log.duration(s) for s in (0.04, 12.34, 59.96, 65.2, 3599.6, 7530)] == [
        "0.0 s", "12.3 s", "1 min 00 s", "1 min 05 s", "1 h 00 min", "2 h 05 min"]
