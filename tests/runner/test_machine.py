"""runner.machine: the CPU record read from a cpuinfo file, what counts as a difference, and
the record of each leg of a run."""

import os

import pytest
import tensorflow as tf

from runner import machine

_CPUINFO = """processor\t: 0
model name\t: Some Xeon(R) CPU @ 2.10GHz
flags\t\t: fpu sse4_2 avx avx2 fma avx512f amx_tile avx512_bf16 ht
bugs\t\t: spectre

processor\t: 1
model name\t: Some Xeon(R) CPU @ 2.10GHz
flags\t\t: fpu sse4_2
"""


def test_cpuinfo_reads_the_model_and_the_kernel_flags_in_a_fixed_order(tmp_path):
    path = tmp_path / "cpuinfo"
    path.write_text(_CPUINFO)
    model, flags = machine._cpuinfo(str(path))
    assert model == "Some Xeon(R) CPU @ 2.10GHz"
    # The first processor's flags, only those that pick kernels, in KERNEL_FLAGS' order.
    assert flags == ["sse4_2", "avx", "avx2", "fma", "avx512f", "avx512_bf16", "amx_tile"]


def test_cpuinfo_without_the_file_names_the_processor(tmp_path):
    model, flags = machine._cpuinfo(str(tmp_path / "absent"))
    assert model and flags == []


def test_describe_this_machine(monkeypatch):
    monkeypatch.setenv("ONEDNN_MAX_CPU_ISA", "AVX2")
    monkeypatch.delenv("TF_ENABLE_ONEDNN_OPTS", raising=False)
    info = machine.describe()
    assert info["cpus"] == os.cpu_count() and info["tensorflow"] == tf.__version__
    assert info["environment"] == {"ONEDNN_MAX_CPU_ISA": "AVX2"} | {
        k: os.environ[k] for k in machine.KERNEL_ENVIRONMENT
        if k in os.environ and k != "ONEDNN_MAX_CPU_ISA"}


def test_differences_ignore_the_platform_string_and_missing_records():
    a = {"cpu": "x", "cpu_features": ["avx2"], "platform": "Linux-6.1", "tensorflow": "2.14.1"}
    assert machine.differences(a, dict(a, platform="Linux-6.5")) == []
    assert machine.differences(a, dict(a, cpu_features=["avx2", "avx512f"])) == ["cpu_features"]
    assert machine.differences(a, None) is None and machine.differences({}, a) is None


def test_legs_are_kept_in_order_and_a_retrained_leg_replaces_later_ones(tmp_path):
    """Legs beginning at rounds 1, 35, 60; the third was stopped before its checkpoint was
    kept and round 60 is trained again on a fourth machine: its line replaces the third's. A
    fresh run (round 1) starts the file again."""
    for first, cpu in ((1, "a"), (35, "b"), (60, "c"), (60, "d")):
        machine.record_leg(tmp_path, first, {"cpu": cpu})
    legs = machine.read_legs(tmp_path)
    assert [(s["first_round"], s["machine"]["cpu"]) for s in legs] == [
        (1, "a"), (35, "b"), (60, "d")]
    assert all(s["started"].endswith("+00:00") for s in legs)  # UTC
    machine.record_leg(tmp_path, 1, {"cpu": "e"})
    assert [s["machine"]["cpu"] for s in machine.read_legs(tmp_path)] == ["e"]
    assert machine.read_legs(tmp_path / "absent") == []


def test_a_damaged_legs_line_is_one_line_naming_file_and_line(tmp_path):
    machine.record_leg(tmp_path, 1, {"cpu": "a"})
    with open(tmp_path / machine.LEGS_FILE, "a") as f:
        f.write('{"started": "2026-11-27"}\n')
    with pytest.raises(ValueError, match=r"legs.jsonl, line 2: not a recorded leg"):
        machine.read_legs(tmp_path)


def test_provenance_names_this_checkouts_commit_and_the_libraries_versions():
    import importlib.metadata
    import subprocess

    import tensorflow_federated as tff

    record = machine.provenance()
    head = subprocess.run(["git", "-C", str(machine.REPOSITORY), "rev-parse", "HEAD"],
                          capture_output=True, text=True).stdout.strip()
    assert record["commit"] == (head or None)
    status = subprocess.run(["git", "-C", str(machine.REPOSITORY), "status", "--porcelain",
                             "--untracked-files=no"], capture_output=True, text=True).stdout
    assert record["dirty"] == bool(status.strip())
    assert record["versions"]["tensorflow"] == tf.__version__
    assert record["versions"]["tensorflow_federated"] == tff.__version__
    assert record["versions"]["keras_nlp"] == importlib.metadata.version("keras-nlp")
    assert record["machine"]["cpus"] == (os.cpu_count() or 1)


def test_a_runs_summary_and_config_record_the_commit_and_the_versions(tmp_path):
    import json

    from runner import run
    from runner.run_config import RunConfig

    config = RunConfig().with_changes(algorithm=["fedavg"], rounds=1, local_steps=1,
                                      partition="iid", output_dir=str(tmp_path))
    run.run(config)
    expected = machine.provenance()
    for name in ("summary.json", "config.json"):
        record = json.loads((tmp_path / name).read_text())["provenance"]
        assert record["commit"] == expected["commit"] and record["dirty"] == expected["dirty"]
        assert record["versions"] == expected["versions"], name
    # config.json's provenance is no section of the configuration: it reads back as the config.
    assert run.read_config(tmp_path) == run.resolve(config)
