"""Peak resident memory of a run, per round: this Python process and the TFF workers it started.

A process's peak RSS is the kernel's high-water mark (`VmHWM` in `/proc/<pid>/status`): the most
physical memory it has held since it started, so no sampling thread is needed and no spike
between two samples is missed. `memory_columns()` gives a metrics row's

    peak_rss_mb          this process (the driver: TFF's compiler, the model builds, evaluation)
    worker_peak_rss_mb   Σ over the local TFF workers this process started (`tffl.runtime`),
                         absent when there are none (`--runtime=distribute` runs in-process;
                         remote workers are another machine's)

in MB (10⁶ bytes). A resumed run starts new processes, so the columns start again; the run's peak
is the largest value over its rows. On a system without `/proc` (not Linux) the columns are
absent.

>>> columns = memory_columns()
>>> columns["peak_rss_mb"] > 10          # this Python, TensorFlow imported
True
"""

from __future__ import annotations

import os

MEMORY_COLUMNS = ("peak_rss_mb", "worker_peak_rss_mb")


def peak_rss_mb(pid: int | None = None) -> float | None:
    """The peak resident memory of process `pid` (default: this one) in MB, or None when the
    system does not report it (no `/proc`) or the process is gone."""
    try:
        with open(f"/proc/{pid or os.getpid()}/status") as status:
            for line in status:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) * 1024 / 1e6   # the kernel reports kB
    except OSError:
        return None
    return None


def memory_columns() -> dict[str, float]:
    """`{"peak_rss_mb": ..., "worker_peak_rss_mb": ...}` now (module docstring); a column whose
    value cannot be read is left out."""
    from tffl.runtime import workers

    columns = {}
    own = peak_rss_mb()
    if own is not None:
        columns["peak_rss_mb"] = round(own, 1)
    peaks = [peak_rss_mb(pid) for pid in workers.live_worker_pids()]
    peaks = [p for p in peaks if p is not None]
    if peaks:
        columns["worker_peak_rss_mb"] = round(sum(peaks), 1)
    return columns
