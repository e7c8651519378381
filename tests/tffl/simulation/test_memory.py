"""tffl.simulation.memory: peak resident memory, checked on child processes that held a known
amount, and the columns a run records."""

import subprocess
import sys

import numpy as np
import pytest
import tensorflow as tf

from tffl.runtime import workers
from tffl.simulation import driver
from tffl.simulation import metrics_log
from tffl.simulation import memory
from tffl.simulation import participation

pytestmark = pytest.mark.skipif(memory.peak_rss_mb() is None, reason="no /proc: not Linux")

# A child that writes `mb` MB (every page touched), frees it, and waits: its high-water mark
# keeps the peak after the memory is gone.
_HOLD = ("import sys, time; x = b'a' * ({mb} * 10**6); del x; print('freed', flush=True); "
         "time.sleep(60)")


def _child(mb):
    child = subprocess.Popen([sys.executable, "-c", _HOLD.format(mb=mb)],
                             stdout=subprocess.PIPE, text=True)
    assert child.stdout.readline().strip() == "freed"
    return child


def _baseline_mb():
    """A bare Python's peak (what the child holds besides its bytes)."""
    child = _child(0)
    try:
        return memory.peak_rss_mb(child.pid)
    finally:
        child.kill()
        child.wait()


def test_the_peak_of_a_child_is_what_it_held_after_it_freed_it():
    base = _baseline_mb()
    child = _child(300)
    try:
        peak = memory.peak_rss_mb(child.pid)
    finally:
        child.kill()
        child.wait()
    assert base + 290 <= peak <= base + 320, (base, peak)
    assert memory.peak_rss_mb(child.pid) is None   # gone


def test_the_worker_column_sums_the_workers(monkeypatch):
    base = _baseline_mb()
    children = [_child(150), _child(250)]
    try:
        monkeypatch.setattr(workers, "live_worker_pids", lambda: [c.pid for c in children])
        columns = memory.memory_columns()
    finally:
        for child in children:
            child.kill()
            child.wait()
    assert 2 * base + 390 <= columns["worker_peak_rss_mb"] <= 2 * base + 420
    assert columns["peak_rss_mb"] >= memory.peak_rss_mb() - 1   # this process, a peak so far
    monkeypatch.setattr(workers, "live_worker_pids", lambda: [])
    assert set(memory.memory_columns()) == {"peak_rss_mb"}


class _Count:
    def initialize(self):
        return {"t": np.int64(0)}

    def next(self, state, datasets):
        del datasets
        return {"t": state["t"] + 1}, {"client_work": {"train": {"loss": 1.0}}}


def test_every_row_records_the_peaks_and_resume_comparisons_ignore_them(tmp_path):
    result = driver.run_rounds(
        _Count(), participation.FullParticipation(["a"]), lambda cid,
        t: tf.data.Dataset.from_tensor_slices([1.0]), 2, tmp_path, driver.RunOptions(log=None))
    rows = metrics_log.read_metrics(tmp_path / "metrics.csv")
    assert all(r["peak_rss_mb"] > 10 for r in rows)
    assert rows[1]["peak_rss_mb"] >= rows[0]["peak_rss_mb"]   # a high-water mark
    assert set(memory.MEMORY_COLUMNS) <= set(metrics_log.MACHINE_COLUMNS)
    assert result.history[-1]["peak_rss_mb"] == rows[-1]["peak_rss_mb"]
