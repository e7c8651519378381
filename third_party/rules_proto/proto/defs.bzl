"""rules_proto's `defs.bzl`, offline: Bazel's built-in proto rules."""

proto_library = native.proto_library
proto_lang_toolchain = native.proto_lang_toolchain
