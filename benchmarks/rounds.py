"""One benchmark configuration's rounds, measured: `BenchmarkRounds` holds run_rounds' callbacks
(the client datasets, and `after_round`, which closes a benchmark round's TFF measurement and runs
the plain rounds), `Measurements` what they record (benchmarks/run.py runs them)."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable

import psutil
import tensorflow as tf

from benchmarks.build import Built
from benchmarks.measure import CompileCounter, PeakSampler, cpu_seconds
from benchmarks.plain import PlainLoop


def merge_peaks(peaks: dict[str, int], new: dict[str, int]) -> None:
    """Raises `peaks` to the peaks in `new`, process by process."""
    for k, v in new.items():
        peaks[k] = max(peaks.get(k, 0), v)


@dataclasses.dataclass
class Measurements:
    """What one configuration measures, per benchmark round: the TFF side's wall seconds (the
    `next` calls; the driver's whole span), CPU seconds (this process; the worker), model_fn calls
    and compilations; each plain loop's wall and CPU seconds and its trace count; and the peak RSS
    by process of each side, the setup seconds and the profiles."""

    tff_times: list[float] = dataclasses.field(default_factory=list)
    tff_driver_times: list[float] = dataclasses.field(default_factory=list)
    tff_cpu_py: list[float] = dataclasses.field(default_factory=list)
    tff_cpu_worker: list[float] = dataclasses.field(default_factory=list)
    model_fn_calls: list[int] = dataclasses.field(default_factory=list)
    compile_calls: list[int] = dataclasses.field(default_factory=list)
    tff_peak: dict[str, int] = dataclasses.field(default_factory=dict)
    plain_times: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    plain_cpu: dict[str, list[float]] = dataclasses.field(default_factory=dict)
    plain_traces: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    plain_peak: dict[str, dict[str, int]] = dataclasses.field(default_factory=dict)
    setup_seconds: float = 0.0
    profiles: dict = dataclasses.field(default_factory=dict)

    @classmethod
    def for_plain(cls, names) -> "Measurements":
        """Empty measurements with a slot for each plain loop in `names`."""
        return cls(plain_times={name: [] for name in names},
                   plain_cpu={name: [] for name in names},
                   plain_traces={name: [] for name in names},
                   plain_peak={name: {} for name in names})


class BenchmarkRounds:
    """run_rounds' callbacks for one configuration, which measure the TFF side and run the plain
    rounds after each benchmark round.

    The TFF side of benchmark round r spans its `per_round` communication rounds in run_rounds:
    from its first client-dataset request (just before the first `next`) to the `after_round`
    callback of its last. Wall time ("TFF s/round") is the sum of the rows' `round_seconds`: the
    `next` calls alone (for FedRep with run_rounds' personal-store look-up and write-back around
    them). CPU, peak memory and the counters are deltas over the whole span, so they also include
    run_rounds' bookkeeping: handing the state and data in and the output apart, flattening the
    metrics into a row and rewriting metrics.csv (no TensorBoard), and, in the last round only,
    the one checkpoint (checkpoint_every = all rounds). `tff_driver_round_seconds` is the span's
    wall time."""

    def __init__(self, built: Built, plain: dict[str, PlainLoop],
                 datasets: list[tf.data.Dataset], sampler: PeakSampler, compiles: CompileCounter,
                 worker: psutil.Process | None, measured: Measurements,
                 log: Callable[[str], None]):
        self.built, self.plain, self.datasets = built, plain, datasets
        self.sampler, self.compiles, self.measured, self.log = sampler, compiles, measured, log
        self.me, self.worker = psutil.Process(), worker
        self.client_ids = [str(i) for i in range(len(datasets))]
        self.by_id = dict(zip(self.client_ids, datasets, strict=True))
        # communication rounds (metrics rows) per benchmark round
        self.per_round = len(built.sub_rounds)
        self.mark: dict[str, float] = {}
        self.rows: list[dict] = []  # the current benchmark round's metrics rows

    def start_benchmark_round(self, round_num: int) -> None:
        # Peak memory since the previous take: in round 1, run_rounds' own start, TFF's work;
        # later, only the idle gap after the plain rounds.
        peak = self.sampler.take()
        if round_num == 1:
            merge_peaks(self.measured.tff_peak, peak)
        self.mark.update(calls=self.built.model_fn_calls.value, compiles=self.compiles.calls,
                         cpu=cpu_seconds(self.me), worker_cpu=cpu_seconds(self.worker),
                         started=time.perf_counter())

    def client_dataset(self, client_id: str, round_num: int) -> tf.data.Dataset:
        # run_rounds asks for the round's datasets right before `next`: the first request of
        # a benchmark round's first communication round starts its TFF measurement.
        if (round_num - 1) % self.per_round == 0 and client_id == self.client_ids[0]:
            self.start_benchmark_round(round_num)
        return self.by_id[client_id]

    def check_traffic(self, rows: list[dict]) -> None:
        """The rows' bytes per client (what run_rounds reports) are the sub-rounds' figures
        this benchmark reports (`built.traffic`), in order."""
        built = self.built
        for row, (name, expected) in zip(rows, built.traffic.items()):
            got = (row.get("bytes_down_per_client"), row.get("bytes_up_per_client"))
            if got != (None, None) and got != (expected.down, expected.up):
                raise RuntimeError(f"{built.algorithm}: run_rounds reported {got} bytes per "
                                   f"client for {name}, the process's traffic says "
                                   f"{(expected.down, expected.up)}")

    def after_round(self, row, state) -> None:
        del state  # the final state is run_rounds' result
        self.rows.append(dict(row))
        if len(self.rows) < self.per_round:
            return
        measured, mark = self.measured, self.mark
        measured.tff_driver_times.append(time.perf_counter() - mark["started"])
        measured.tff_times.append(sum(r["round_seconds"] for r in self.rows))
        merge_peaks(measured.tff_peak, self.sampler.take())
        measured.tff_cpu_py.append(cpu_seconds(self.me) - mark["cpu"])
        measured.tff_cpu_worker.append(cpu_seconds(self.worker) - mark["worker_cpu"])
        measured.model_fn_calls.append(self.built.model_fn_calls.value - mark["calls"])
        measured.compile_calls.append(self.compiles.calls - mark["compiles"])
        self.check_traffic(self.rows)
        self.rows.clear()
        self.run_plain_rounds()
        self.log(f"  round {len(measured.tff_times)}: TFF {measured.tff_times[-1]:.2f} s, "
                 + ", ".join(f"{name} {measured.plain_times[name][-1]:.2f} s"
                             for name in self.plain))

    def run_plain_rounds(self) -> None:
        """One round of every plain loop, each timed and sampled on its own."""
        measured = self.measured
        for name, loop in self.plain.items():
            self.sampler.take()
            cpu0 = cpu_seconds(self.me)
            started = time.perf_counter()
            loop.round(self.datasets)
            measured.plain_times[name].append(time.perf_counter() - started)
            measured.plain_cpu[name].append(cpu_seconds(self.me) - cpu0)
            merge_peaks(measured.plain_peak[name], self.sampler.take())
            measured.plain_traces[name].append(loop.traces)
