"""What the tests of scripts/train.py share: fast flags, the metrics rows of a run, and running
train.py in this process (`scripts.train.run_command_line`) or, for the tests about processes
(signals, killed workers, exit statuses of the real interpreter), as a child."""

from __future__ import annotations

import dataclasses
import pathlib
import subprocess

from tffl.simulation import metrics_log
from tests import forked_python

SCRIPT = pathlib.Path(__file__).resolve().parents[2] / "scripts" / "train.py"
FAST = ["--algorithm=fedavg", "--partition=iid", "--num_clients=6", "--clients_per_round=3",
        "--local_steps=3", "--eval_every=2", "--learning_rate=0.1"]


@dataclasses.dataclass
class Run:
    """A finished train.py: exit status and what it printed (the fields of
    `subprocess.CompletedProcess` the tests read)."""

    returncode: int
    stdout: str
    stderr: str


def run_in_process(capsys, *args) -> Run:
    """`train.py <args>` in this process; `capsys` (pytest's fixture) collects its output."""
    from scripts import train

    capsys.readouterr()  # drop what came before
    status = train.run_command_line(["train.py", *args])
    captured = capsys.readouterr()
    return Run(status, captured.out, captured.err)


def run_child(*args, timeout=300) -> subprocess.CompletedProcess:
    """`python scripts/train.py <args>` as a child process, forked from a Python that has
    imported TFF (tests/forked_python.py)."""
    return forked_python.run_script(SCRIPT, *args, timeout=timeout)


def rows(path):
    """metrics.csv of the run in `path`, without its timing columns."""
    drop = set(metrics_log.MACHINE_COLUMNS)
    return [{k: v for k, v in r.items() if k not in drop}
            for r in metrics_log.read_metrics(path / "metrics.csv")]
