#!/bin/sh
echo "bazel coverage is not supported offline (third_party/remote_coverage_tools is empty); use pytest-cov" >&2
exit 1
