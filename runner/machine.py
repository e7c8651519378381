"""The machine a run ran on, for its `summary.json` (and the benchmark's report).

Float results depend on it: TensorFlow's CPU kernels (oneDNN's matmuls among them) pick their
instructions from the CPU they find, and another instruction set rounds differently. Two runs of
the same flags and code on one machine repeat bit for bit here (resumed or not). Experiment 1's
FedSA-LoRA run at N = 3 and its rerun three days later parted at round 2 (training loss
0.6876596808 against 0.6876596212). On today's AVX-512 machine the code of the commit that
archived the run (c40c859) gives the rerun's figure, and today's code gives the run's once oneDNN
is held to AVX2 (`ONEDNN_MAX_CPU_ISA=AVX2`): the run had met a CPU without AVX-512.
`describe()` records what decides the kernels, so such a difference can be read off the runs'
summaries rather than guessed. A run continued with `--resume` is trained in several legs
(a leg: one process's stretch of the run, from its start or a resume to its end) and may
have met several machines: `record_leg` keeps one line per leg in the run's
`legs.jsonl` (the round it began with, when, and `describe()`), which `summary.json` repeats
as `legs`.

Example:

>>> info = describe()
>>> sorted(info)
['cpu', 'cpu_features', 'cpus', 'environment', 'platform', 'python', 'tensorflow']
>>> info["cpus"] >= 1 and isinstance(info["cpu_features"], list)
True
>>> differences(info, dict(info, cpu="another CPU")), differences(info, None)
(['cpu'], None)
>>> run = run_dir / "machine_example"
>>> record_leg(run, 1, info); record_leg(run, 35, dict(info, cpu="another CPU"))
>>> [(s["first_round"], s["machine"]["cpu"] == info["cpu"]) for s in read_legs(run)]
[(1, True), (35, False)]
"""

from __future__ import annotations

import datetime
import json
import os
import pathlib
import platform
from collections.abc import Mapping
from typing import Any

# The CPU flags (as /proc/cpuinfo spells them) whose presence changes which kernels TensorFlow
# and oneDNN run.
KERNEL_FLAGS = ("sse4_2", "avx", "avx2", "fma", "avx_vnni", "avx512f", "avx512bw", "avx512dq",
                "avx512vl", "avx512_vnni", "avx512_bf16", "avx512_fp16", "amx_tile", "amx_bf16",
                "amx_int8")
# Environment variables that change TensorFlow's CPU arithmetic, recorded when set.
KERNEL_ENVIRONMENT = ("TF_ENABLE_ONEDNN_OPTS", "ONEDNN_MAX_CPU_ISA", "TF_DETERMINISTIC_OPS",
                      "OMP_NUM_THREADS", "TF_NUM_INTRAOP_THREADS", "TF_NUM_INTEROP_THREADS")


def _cpuinfo(path: str = "/proc/cpuinfo") -> tuple[str, list[str]]:
    """(model name, the KERNEL_FLAGS it has) from `path`; on a system without it, the
    processor `platform` names and no flags."""
    try:
        with open(path) as f:
            text = f.read()
    except OSError:
        return platform.processor() or platform.machine(), []
    model, flags = "", set()
    for line in text.splitlines():
        key, _, value = line.partition(":")
        key = key.strip()
        if key == "model name" and not model:
            model = value.strip()
        elif key == "flags" and not flags:
            flags = set(value.split())
    return model or platform.machine(), [f for f in KERNEL_FLAGS if f in flags]


def describe() -> dict[str, Any]:
    """{"cpu", "cpu_features", "cpus", "platform", "python", "tensorflow", "environment"}: the
    CPU's model name and kernel-relevant flags, the core count, the OS, Python's and
    TensorFlow's versions, and the KERNEL_ENVIRONMENT variables that are set."""
    import tensorflow as tf

    model, features = _cpuinfo()
    return {
        "cpu": model,
        "cpu_features": features,
        "cpus": os.cpu_count() or 1,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "tensorflow": tf.__version__,
        "environment": {k: os.environ[k] for k in KERNEL_ENVIRONMENT if k in os.environ},
    }


def differences(a: Mapping[str, Any] | None,
                b: Mapping[str, Any] | None) -> list[str] | None:
    """The keys of two `describe()` records that differ, other than `platform` (which names
    the kernel release too); None if either is missing (a run from before it was recorded)."""
    if not a or not b:
        return None
    return sorted(k for k in set(a) | set(b) if k != "platform" and a.get(k) != b.get(k))


# The checkout the code runs from (this file's repository).
REPOSITORY = pathlib.Path(__file__).resolve().parents[1]
# The libraries whose versions decide a run's numbers besides TensorFlow's.
VERSIONED = ("tensorflow", "tensorflow_federated", "keras_nlp", "numpy")


def _git(*args: str) -> str | None:
    """`git <args>` in REPOSITORY, its stripped output; None where git or the checkout is
    missing (an installed copy)."""
    import subprocess

    try:
        done = subprocess.run(["git", "-C", str(REPOSITORY), *args], capture_output=True,
                              text=True, timeout=30, check=True)
    except (OSError, subprocess.SubprocessError):
        return None
    return done.stdout.strip()


def provenance() -> dict[str, Any]:
    """{"commit", "dirty", "versions", "machine"}: the commit of the code that runs (None outside
    a git checkout), whether its tracked files differ from that commit, the versions of the
    libraries that decide the numbers (`VERSIONED`) and the machine (`describe()`). Recorded in
    every run's `config.json` and `summary.json`, so that runs at different commits can be told
    apart.

    >>> record = provenance()
    >>> sorted(record), sorted(record["versions"])
    (['commit', 'dirty', 'machine', 'versions'], ['keras_nlp', 'numpy', 'tensorflow', 'tensorflow_federated'])
    >>> record["commit"] is None or len(record["commit"]) == 40
    True
    """
    from importlib import metadata

    versions = {}
    for name in VERSIONED:
        try:
            versions[name] = metadata.version(name.replace("_", "-"))
        except metadata.PackageNotFoundError:
            versions[name] = None
    commit = _git("rev-parse", "HEAD")
    status = _git("status", "--porcelain", "--untracked-files=no") if commit else None
    return {"commit": commit, "dirty": None if status is None else bool(status),
            "versions": versions, "machine": describe()}


LEGS_FILE = "legs.jsonl"


def record_leg(run_dir: os.PathLike | str, first_round: int,
               info: Mapping[str, Any] | None = None) -> None:
    """Appends to `run_dir`'s LEGS_FILE the leg that began with round `first_round`:
    {"first_round", "started" (UTC, ISO 8601), "machine": `info` or `describe()`}. Lines of
    legs that began at `first_round` or later are dropped first: their rounds were not
    checkpointed and are being trained again (a fresh run, `first_round` 1, starts the file)."""
    path = pathlib.Path(run_dir) / LEGS_FILE
    kept = [s for s in read_legs(run_dir) if s["first_round"] < first_round]
    kept.append({"first_round": first_round,
                 "started": datetime.datetime.now(datetime.timezone.utc).isoformat(
                     timespec="seconds"),
                 "machine": dict(info) if info is not None else describe()})
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(s, sort_keys=True) + "\n" for s in kept))


def read_legs(run_dir: os.PathLike | str) -> list[dict[str, Any]]:
    """The legs `record_leg` recorded for `run_dir`, oldest first ([] for a run from
    before the record).

    Raises:
      ValueError: naming the file and line, if a line is not a recorded leg."""
    path = pathlib.Path(run_dir) / LEGS_FILE
    if not path.exists():
        return []
    legs = []
    for number, line in enumerate(path.read_text().splitlines(), 1):
        try:
            leg = json.loads(line)
            leg["first_round"] = int(leg["first_round"])
        except (ValueError, TypeError, KeyError) as e:
            raise ValueError(f"{path}, line {number}: not a recorded leg ({e!r}); delete "
                             "the line (it only records machines)") from None
        legs.append(leg)
    return legs
