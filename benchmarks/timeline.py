"""Where a command's memory and seconds go: its resident memory and CPU time, driver and TFF
worker apart, sampled through its run and cut at its progress lines.

`run_timeline(command, interval_s)` starts `command` (e.g. `python scripts/train.py ...`) as a
child, echoes its output (stdout and stderr together) with the seconds since its start, and
every `interval_s` reads from `/proc` the resident memory (`VmRSS`) and the CPU seconds (user +
system) of

    driver   the child itself (the Python process: model builds, TFF's tracing and compiler,
             evaluation)
    worker   its descendants running TFF's `worker_binary` (the computations' execution)

A stage runs from one progress line of the command to the next: a `tffl:`/absl progress line
ending in "..." (`tffl.simulation.metrics_log.announce`: "building rolora's TFF computations
...", "loading the pretrained weights of ..."), a "round t/T" line, or the "done:" line. Per
stage: its seconds, each process's CPU seconds in it (the worker's "–" where the workers
stopped inside the stage, taking their CPU time with them), and its resident memory at the
stage's end and at most in it (MB, 10⁶ bytes). Peaks between two samples can be missed; the kernel's own
high-water marks (`tffl.simulation.memory`, `metrics.csv`) cannot.

>>> line = "I1201 21:51:28.766737 140687 metrics_log.py:188] building rolora's TFF computations ..."
>>> progress_label(line), progress_label("round 2/500  loss 0.69"), progress_label("x = 1")
("building rolora's TFF computations ...", 'round 2/500', None)
"""

from __future__ import annotations

import dataclasses
import os
import re
import subprocess
import threading
import time
from collections.abc import Callable, Sequence

_ABSL_PREFIX = re.compile(r"^[IWEF]\d{4} [\d:.]+\s+\d+ \S+:\d+\] ")
_ROUND = re.compile(r"^round (\d+/\d+)")
_CLOCK = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Sample:
    """One reading: seconds since the start; resident MB and CPU seconds of driver and worker."""

    seconds: float
    driver_mb: float
    worker_mb: float
    driver_cpu_s: float
    worker_cpu_s: float


def progress_label(line: str) -> str | None:
    """The stage a progress line of the command opens (module docstring), or None."""
    text = _ABSL_PREFIX.sub("", line.strip()).removeprefix("tffl: ")
    found = _ROUND.match(text)
    if found:
        return f"round {found.group(1)}"
    if text.startswith("done:") or text.endswith(" ..."):
        return text
    return None


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
                children.setdefault(int(fields[1]), []).append(int(entry))
            except OSError:
                continue
    return children


def _read(pid: int) -> tuple[float, float]:
    """(resident MB, CPU seconds) of `pid`; (0, 0) if it is gone."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        with open(f"/proc/{pid}/statm") as f:
            resident_pages = int(f.read().split()[1])
    except OSError:
        return 0.0, 0.0
    cpu = (int(fields[11]) + int(fields[12])) / _CLOCK
    return resident_pages * os.sysconf("SC_PAGE_SIZE") / 1e6, cpu


def _is_worker(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return b"worker_binary" in f.read()
    except OSError:
        return False


def sample(root: int, started: float) -> Sample:
    """One `Sample` of process `root` (the driver) and its worker descendants."""
    tree, stack, workers = _children(), [root], []
    while stack:
        for child in tree.get(stack.pop(), []):
            stack.append(child)
            if _is_worker(child):
                workers.append(child)
    driver_mb, driver_cpu = _read(root)
    worker = [_read(pid) for pid in workers]
    return Sample(time.perf_counter() - started, driver_mb, sum(m for m, _ in worker),
                  driver_cpu, sum(c for _, c in worker))


def run_timeline(command: Sequence[str], interval_s: float = 0.5,
                 echo: Callable[[str], None] = print) -> tuple[int, list[Sample], list]:
    """Runs `command`; returns (its exit status, the samples, the progress marks as
    (seconds, label))."""
    started = time.perf_counter()
    child = subprocess.Popen(list(command), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                             text=True, bufsize=1)
    samples: list[Sample] = []
    marks: list[tuple[float, str]] = [(0.0, "start")]
    done = threading.Event()

    def sampler():
        while not done.is_set():
            reading = sample(child.pid, started)
            if reading.driver_mb > 0:   # 0: the command has exited
                samples.append(reading)
            done.wait(interval_s)

    thread = threading.Thread(target=sampler, daemon=True)
    thread.start()
    for line in child.stdout:
        now = time.perf_counter() - started
        echo(f"[{now:8.1f} s] {line.rstrip()}")
        label = progress_label(line)
        if label is not None:
            marks.append((now, label))
    status = child.wait()
    done.set()
    thread.join()
    return status, samples, marks


def stages(samples: Sequence[Sample], marks: Sequence[tuple[float, str]]) -> list[dict]:
    """Per stage (from one mark to the next; the last to the final sample): its label, seconds,
    CPU seconds of driver and worker in it, and their resident MB at its end and at most."""
    rows = []
    ends = [t for t, _ in marks[1:]] + [samples[-1].seconds if samples else marks[-1][0]]
    for (begin, label), end in zip(marks, ends):
        inside = [s for s in samples if begin <= s.seconds <= end]
        before = [s for s in samples if s.seconds <= begin]
        if not inside:
            continue
        first = before[-1] if before else inside[0]
        last = inside[-1]
        rows.append({
            "stage": label, "seconds": end - begin,
            "driver_cpu_s": last.driver_cpu_s - first.driver_cpu_s,
            # None where the workers stopped inside the stage (their CPU time went with them)
            "worker_cpu_s": (None if first.worker_mb > 0 and last.worker_mb == 0
                             else last.worker_cpu_s - first.worker_cpu_s),
            "driver_mb_end": last.driver_mb, "worker_mb_end": last.worker_mb,
            "driver_mb_max": max(s.driver_mb for s in inside),
            "worker_mb_max": max(s.worker_mb for s in inside)})
    return rows


def format_stages(rows: Sequence[dict]) -> str:
    """The stages as a Markdown table."""
    lines = ["| stage | s | driver CPU s | worker CPU s | driver MB (end, max) | "
             "worker MB (end, max) |", "|---|---|---|---|---|---|"]
    for r in rows:
        worker_cpu = "–" if r["worker_cpu_s"] is None else f"{r['worker_cpu_s']:.1f}"
        lines.append(f"| {r['stage']} | {r['seconds']:.1f} | {r['driver_cpu_s']:.1f} | "
                     f"{worker_cpu} | {r['driver_mb_end']:,.0f}, "
                     f"{r['driver_mb_max']:,.0f} | {r['worker_mb_end']:,.0f}, "
                     f"{r['worker_mb_max']:,.0f} |")
    return "\n".join(lines)
