"""Opening a GGUF file and reading its metadata, for `models.gguf_checkpoint` (the model's config
and tensors) and `models.gemma3_tokenizer` (its vocabulary).

>>> metadata_value(open_reader(path), "general.architecture")  # doctest: +SKIP
'gemma3'
"""

from __future__ import annotations

import os


def open_reader(path_or_reader):
    """A `gguf.GGUFReader` of a path, or the reader given."""
    import gguf

    if isinstance(path_or_reader, gguf.GGUFReader):
        return path_or_reader
    return gguf.GGUFReader(os.fspath(path_or_reader))


def metadata_value(reader, key: str, default=None):
    """The value of metadata `key`; `default` when absent, or `ValueError` naming the key when
    there is no default."""
    field = reader.fields.get(key)
    if field is None:
        if default is None:
            raise ValueError(f"GGUF metadata has no {key!r}")
        return default
    return field.contents()
