"""experiments.machine: the CPU record read from a cpuinfo file, and what counts as a difference."""

import os

import tensorflow as tf

from experiments import machine

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
