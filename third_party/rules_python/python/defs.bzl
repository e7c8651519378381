"""rules_python's `defs.bzl`, offline: Bazel 4.2.3's built-in Python rules under their usual names."""

load("@bazel_tools//tools/python:toolchain.bzl", _py_runtime_pair = "py_runtime_pair")

py_library = native.py_library
py_binary = native.py_binary
py_test = native.py_test
py_runtime = native.py_runtime
py_runtime_pair = _py_runtime_pair
