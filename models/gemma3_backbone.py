"""`Gemma3Backbone`: Gemma 3's text decoder as a functional Keras 2 model, KerasNLP style.

    x_0 = E[token_ids] · sqrt(H)                      E: (V, H), `token_embedding`
    x_{i+1} = Gemma3Decoder_i(x_i, padding_mask)      i = 0..L−1, `transformer_layers[i]`
    hidden = RMSNorm(x_L)                             `layer_norm`
    logits = hidden · Eᵀ                              `token_embedding(hidden, reverse=True)`

Inputs `{"token_ids": (B, T) int32, "padding_mask": (B, T) int32}`, output `hidden` (B, T, H);
`call_with_cache` runs new tokens over a key/value cache per layer (a prompt once, then one
token a call; `models.lm_evaluation.generate` uses it). The architecture is one
`Gemma3BackboneConfig`. Decoder layer i is global (RoPE base
`global_rope_base`, full causal attention) iff (i + 1) % `global_layer_every` == 0, otherwise
local (RoPE base `local_rope_base`, window `sliding_window`); Gemma 3 has five local layers per
global one (`Gemma3BackboneConfig.layer(i)`, the layer's `Gemma3DecoderConfig`). The output
embedding is the input embedding (`Gemma3Embedding`, a `keras_nlp.layers.ReversibleEmbedding`
with tied weights); the sqrt(H) scaling is a separate `Rescaling` layer, so the reverse
projection uses E itself.

`gemma3_270m_config()` is google/gemma-3-270m's config (the GGUF file's, `models.gguf_checkpoint`);
`gemma3_1b_config()` is Gemma 3 1B's published one (no checkpoint here: random weights).

Example (a tiny random model):

>>> import numpy as np
>>> config = Gemma3BackboneConfig(vocabulary_size=32, num_layers=2, num_query_heads=2,
...     num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
...     sliding_window=3, global_layer_every=2)
>>> backbone = Gemma3Backbone(config)
>>> ids = np.array([[2, 5, 7, 9]], np.int32)
>>> hidden = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
>>> hidden.shape, backbone.token_embedding(hidden, reverse=True).shape
(TensorShape([1, 4, 8]), TensorShape([1, 4, 32]))
>>> [layer.config.sliding_window for layer in backbone.transformer_layers]
[3, None]
>>> Gemma3Backbone.from_config(backbone.get_config()).config == config
True
>>> inputs = {"token_ids": ids, "padding_mask": np.ones_like(ids)}
>>> x_1 = backbone.layer_input(inputs, 1)   # the input of decoder layer 1
>>> np.allclose(backbone.from_layer(x_1, inputs["padding_mask"], 1), hidden, atol=1e-6)
True
"""

from __future__ import annotations

import dataclasses
import math

import keras_nlp
import tensorflow as tf

from models import base_precision
from models.causal_lm import output_logits
from models.gemma3_decoder import Gemma3Decoder, Gemma3DecoderConfig, Gemma3RMSNorm


@dataclasses.dataclass(frozen=True)
class Gemma3BackboneConfig:
    """The architecture of a `Gemma3Backbone` (module doc); `get_config()` holds it as a dict.

    Attributes:
      vocabulary_size, num_layers, hidden_dim, intermediate_dim: V, L, H, F.
      num_query_heads, num_key_value_heads, head_dim: N, K, D of every attention block.
      layer_norm_epsilon: ε of every RMSNorm.
      global_rope_base, local_rope_base: RoPE bases of the global and local layers.
      sliding_window: W of the local layers.
      global_layer_every: layer i is global iff (i + 1) % global_layer_every == 0.
      query_scale: multiplies the queries; None: D^-1/2 (filled in, as a float).
    """

    vocabulary_size: int
    num_layers: int
    num_query_heads: int
    num_key_value_heads: int
    hidden_dim: int
    intermediate_dim: int
    head_dim: int
    layer_norm_epsilon: float = 1e-6
    global_rope_base: float = 1e6
    local_rope_base: float = 1e4
    sliding_window: int = 512
    global_layer_every: int = 6
    query_scale: float | None = None

    def __post_init__(self):
        scale = self.head_dim ** -0.5 if self.query_scale is None else self.query_scale
        object.__setattr__(self, "query_scale", float(scale))
        object.__setattr__(self, "global_rope_base", float(self.global_rope_base))
        object.__setattr__(self, "local_rope_base", float(self.local_rope_base))

    def layer(self, index: int) -> Gemma3DecoderConfig:
        """Decoder layer `index`'s architecture (0-based): global (RoPE base `global_rope_base`,
        no window) or local (`local_rope_base`, window `sliding_window`), `is_global_layer`."""
        is_global = is_global_layer(index, self.global_layer_every)
        return Gemma3DecoderConfig(
            intermediate_dim=self.intermediate_dim, num_query_heads=self.num_query_heads,
            num_key_value_heads=self.num_key_value_heads, head_dim=self.head_dim,
            query_scale=self.query_scale,
            rope_base=self.global_rope_base if is_global else self.local_rope_base,
            sliding_window=None if is_global else self.sliding_window,
            layer_norm_epsilon=self.layer_norm_epsilon)


def gemma3_270m_config() -> Gemma3BackboneConfig:
    """The `Gemma3BackboneConfig` of Gemma 3 270M (268,098,176 parameters: 167,772,160 in the
    tied embedding, 100,326,016 in the 18 decoder layers and the final norm)."""
    return Gemma3BackboneConfig(
        vocabulary_size=262_144, num_layers=18, num_query_heads=4, num_key_value_heads=1,
        hidden_dim=640, intermediate_dim=2048, head_dim=256, layer_norm_epsilon=1e-6,
        global_rope_base=1e6, local_rope_base=1e4, sliding_window=512, global_layer_every=6,
        query_scale=256 ** -0.5)


def gemma3_1b_config() -> Gemma3BackboneConfig:
    """The `Gemma3BackboneConfig` of Gemma 3 1B as Google publishes it (google/gemma-3-1b-pt's
    config.json: 26 layers, width 1152, FFN 6912, 4 query heads and 1 key/value head of 256,
    window 512, the same 262,144-piece vocabulary as 270M): 999,885,952 parameters,
    301,989,888 of them in the tied embedding. This project has no checkpoint of it: the
    decoder `gemma3_1b_random` (`models.decoders`) gives it random weights, to measure memory
    and time at that size."""
    return Gemma3BackboneConfig(
        vocabulary_size=262_144, num_layers=26, num_query_heads=4, num_key_value_heads=1,
        hidden_dim=1152, intermediate_dim=6912, head_dim=256, layer_norm_epsilon=1e-6,
        global_rope_base=1e6, local_rope_base=1e4, sliding_window=512, global_layer_every=6,
        query_scale=256 ** -0.5)


def is_global_layer(index: int, global_layer_every: int) -> bool:
    """Whether decoder layer `index` (0-based) attends globally: every `global_layer_every`-th.

    >>> [i for i in range(18) if is_global_layer(i, 6)]
    [5, 11, 17]
    """
    return (index + 1) % global_layer_every == 0


@tf.keras.utils.register_keras_serializable(package="tffl")
class Gemma3Embedding(keras_nlp.layers.ReversibleEmbedding):
    """KerasNLP's tied `ReversibleEmbedding` whose lookup gathers rows from one plain read of
    the table, `gather(read(E), ids)`, instead of `embedding_lookup` on the variable. The
    variable's sparse read (`ResourceGather`) puts it in copy-on-read mode while another tensor
    shares its buffer (the frozen base restored into it: `tffl.engine.rounds`), so that lookup
    copied the table once and every later read of it (the output projection's,
    `causal_lm.output_logits`) once more: a TFF worker held Gemma 3 270M's table three times
    (3 × 671 MB in float32; heaptrack, docs/PERFORMANCE.md). The same rows either way:

    >>> import numpy as np
    >>> embedding = Gemma3Embedding(7, 3)
    >>> ids = np.array([[0, 6, 2]], np.int32)
    >>> bool(np.array_equal(embedding(ids), embedding.embeddings.numpy()[ids]))
    True

    `base_dtype` stores the table as `models.base_precision` says ("bfloat16": its dtype
    policy; "int8": `embeddings` int8 and `embeddings_scale` (V, H / 32) float32, a scale per
    block of 32 of each row's H values (one per row when H is not a multiple of 32), the
    lookup widening the rows it gathers, E[ids] ≈ float32(q[ids])·s[ids]):

    >>> low = Gemma3Embedding(7, 3, base_dtype="int8")
    >>> rows = low(ids).numpy()
    >>> widened = low.embeddings.numpy().astype(np.float32) * low.embeddings_scale.numpy()
    >>> low.embeddings.dtype.name, bool(np.allclose(rows, widened[ids]))
    ('int8', True)
    >>> bool(np.allclose(low(rows[0], reverse=True), rows[0] @ widened.T, atol=1e-6))
    True
    """

    def __init__(self, input_dim, output_dim, base_dtype: str = "float32", **kwargs):
        kwargs.setdefault("dtype", base_precision.frozen_policy(base_dtype))
        super().__init__(input_dim, output_dim, **kwargs)
        self.base_dtype = base_dtype

    def build(self, inputs_shape=None):
        if self.base_dtype != "int8":
            return super().build(inputs_shape)
        if not self.tie_weights:
            raise ValueError("an int8 Gemma3Embedding is tied (its table is the output "
                             "projection): pass tie_weights=True")
        self.embeddings, self.embeddings_scale = base_precision.add_int8_weight(
            self, "embeddings", (self.input_dim, self.output_dim),
            self.embeddings_initializer, axis=1)
        self.built = True

    def call(self, inputs, reverse=False):
        if reverse and self.base_dtype == "int8":
            return output_logits(self, inputs)   # the scaled product, a block at a time
        if reverse:
            return super().call(inputs, reverse=True)
        table = tf.convert_to_tensor(self.embeddings)   # stored dtype: the lookup does not autocast
        ids = tf.cast(inputs, tf.int32)
        rows = tf.gather(table, ids)
        if self.base_dtype == "int8":   # each row's blocks times their scales
            scales = tf.gather(tf.convert_to_tensor(self.embeddings_scale), ids)
            return base_precision.widen(rows, scales, axis=rows.shape.rank - 1)
        return tf.cast(rows, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "base_dtype": self.base_dtype}


@tf.keras.utils.register_keras_serializable(package="tffl")
class Gemma3Backbone(tf.keras.Model):
    """Gemma 3's decoder stack (module doc); `get_config()` / `from_config()` round-trip.

    Args:
      config: the architecture (`Gemma3BackboneConfig`).
      initializer: the starting weights of the embedding and every projection: "random"
        (N(0, 0.02²) embedding, Glorot-uniform kernels) or "zeros", for a model whose weights
        a checkpoint replaces (it spares 268M random draws per build).
      base_dtype: what the embedding table and the projections' kernels are stored at:
        "float32", "bfloat16" (half the bytes) or "int8" (28%: a float32 scale per block of 32
        inputs of each output channel), read widened to float32 in the step (`models.base_precision`). The
        norms' weights, and LoRA factors added later, are float32.

    A bfloat16 base computes what a float32 model with the weights rounded to bfloat16 does:

    >>> import numpy as np
    >>> config = Gemma3BackboneConfig(vocabulary_size=32, num_layers=2, num_query_heads=2,
    ...     num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
    ...     sliding_window=3, global_layer_every=2)
    >>> low = Gemma3Backbone(config, base_dtype="bfloat16")
    >>> low.token_embedding.embeddings.dtype.name
    'bfloat16'
    >>> wide = Gemma3Backbone(config)
    >>> for target, source in zip(wide.weights, low.weights):
    ...     _ = target.assign(tf.cast(source.value(), tf.float32))
    >>> inputs = {"token_ids": np.array([[2, 5, 7, 9]], np.int32),
    ...           "padding_mask": np.ones((1, 4), np.int32)}
    >>> bool(np.allclose(low(inputs), wide(inputs), atol=1e-5))
    True
    """

    def __init__(self, config: Gemma3BackboneConfig, initializer: str = "random",
                 base_dtype: str = "float32", **kwargs):
        if initializer not in ("random", "zeros"):
            raise ValueError(f"initializer={initializer!r}: choose 'random' or 'zeros'")
        zeros = initializer == "zeros"
        token_ids = tf.keras.Input(shape=(None,), dtype="int32", name="token_ids")
        padding_mask = tf.keras.Input(shape=(None,), dtype="int32", name="padding_mask")
        token_embedding = Gemma3Embedding(
            config.vocabulary_size, config.hidden_dim, tie_weights=True,
            embeddings_initializer=("zeros" if zeros
                                    else tf.keras.initializers.RandomNormal(stddev=0.02)),
            base_dtype=base_dtype, name="token_embedding")
        x = token_embedding(token_ids)
        x = tf.keras.layers.Rescaling(math.sqrt(config.hidden_dim), name="embedding_scale")(x)
        transformer_layers = []
        for i in range(config.num_layers):
            layer = Gemma3Decoder(config.layer(i),
                                  kernel_initializer="zeros" if zeros else "glorot_uniform",
                                  base_dtype=base_dtype, name=f"transformer_layer_{i}")
            x = layer(x, decoder_padding_mask=padding_mask)
            transformer_layers.append(layer)
        layer_norm = Gemma3RMSNorm(config.layer_norm_epsilon, name="sequence_output_layernorm")
        hidden = layer_norm(x)
        super().__init__(inputs={"token_ids": token_ids, "padding_mask": padding_mask},
                         outputs=hidden, **kwargs)
        self.token_embedding = token_embedding
        self.transformer_layers = transformer_layers
        self.layer_norm = layer_norm
        self.config = config
        self.initializer = initializer
        self.base_dtype = base_dtype

    def layer_input(self, inputs: dict, layer: int) -> tf.Tensor:
        """x_layer (B, T, H): the input of decoder layer `layer` (0 ≤ layer ≤ L), from `inputs`
        `{"token_ids", "padding_mask"}` through the embedding and decoder layers 0..layer−1."""
        x = self.get_layer("embedding_scale")(self.token_embedding(inputs["token_ids"]))
        for block in self.transformer_layers[:layer]:
            x = block(x, decoder_padding_mask=inputs["padding_mask"])
        return x

    def from_layer(self, x: tf.Tensor, padding_mask: tf.Tensor, layer: int) -> tf.Tensor:
        """hidden (B, T, H) from x_layer: decoder layers layer..L−1 and the final norm, so that
        `from_layer(layer_input(inputs, k), inputs["padding_mask"], k)` is `self(inputs)`."""
        for block in self.transformer_layers[layer:]:
            x = block(x, decoder_padding_mask=padding_mask)
        return self.layer_norm(x)

    def call_with_cache(self, token_ids, cache, cache_update_index, positions, key_positions):
        """hidden (B, T, H) of T new tokens per row, over a key/value cache: `(hidden, cache)`.

        `token_ids` (B, T) int32 sit at positions `positions` (B, T) int32 (each row its own);
        `cache` is a tuple of L tensors (B, 2, S, K, D), decoder layer i's keys and values, slot
        j of row b holding the token at position `key_positions[b, j]` ((B, S) int32; an empty
        or padding slot: any position later than every query's). Every layer writes the new
        tokens' keys and values into slots i..i+T−1 (i = `cache_update_index`) and attends
        over its cache (`Gemma3Decoder.call_with_cache`: causal by position, the local layers'
        window by position), through the same (possibly LoRA-wrapped) layers as `call`. A
        prompt pass (i = 0, T = the prompt width) fills the cache; then one token per row a
        call (T = 1) costs one position. Row b's hidden state at position t equals the uncached
        `self(inputs)`'s when the cache holds exactly that row's tokens at positions < t.

        >>> import numpy as np, tensorflow as tf
        >>> config = Gemma3BackboneConfig(vocabulary_size=32, num_layers=2, num_query_heads=2,
        ...     num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
        ...     sliding_window=2, global_layer_every=2)
        >>> backbone = Gemma3Backbone(config)
        >>> ids = np.array([[2, 5, 7, 9, 4]], np.int32)
        >>> full = backbone({"token_ids": ids, "padding_mask": np.ones_like(ids)})
        >>> cache = tuple(tf.zeros([1, 2, 5, 1, 4]) for _ in range(2))
        >>> keys, positions = np.arange(5)[None], np.arange(5)[None]
        >>> _, cache = backbone.call_with_cache(ids[:, :3], cache, 0, positions[:, :3], keys)
        >>> step, cache = backbone.call_with_cache(ids[:, 3:4], cache, 3, positions[:, 3:4], keys)
        >>> bool(np.allclose(step, full[:, 3:4], atol=1e-5))
        True
        """
        x = self.get_layer("embedding_scale")(self.token_embedding(token_ids))
        updated = []
        for block, layer_cache in zip(self.transformer_layers, cache):
            x, layer_cache = block.call_with_cache(x, layer_cache, cache_update_index, positions,
                                                   key_positions)
            updated.append(layer_cache)
        return self.layer_norm(x), tuple(updated)

    def get_config(self):
        return {"name": self.name, "trainable": self.trainable,
                "config": dataclasses.asdict(self.config), "initializer": self.initializer,
                "base_dtype": self.base_dtype}

    @classmethod
    def from_config(cls, config, custom_objects=None):
        config = dict(config)
        return cls(Gemma3BackboneConfig(**config.pop("config")), **config)


def random_values(backbone: Gemma3Backbone, seed: int = 0) -> dict:
    """`{variable.ref(): numpy value}`: every weight of `backbone` drawn from the distributions
    `initializer="random"` draws from, in numpy from `seed`, stored at the backbone's base dtype:

        E ~ N(0, 0.02²)                         the embedding table (V, H)
        W ~ U(−a, a), a = sqrt(6 / (m·r + n·r)) a projection's kernel of shape (..., m, n),
                                                r = prod(shape[:-2]) (Keras's Glorot uniform)
        g = 1                                   each RMSNorm's scale

    A bfloat16 base rounds each draw to nearest; an int8 base quantizes it with its scales
    beside (`base_precision.absmax_int8`, the same blocks as a checkpoint's). The backbone may be
    built in a graph (`tf.Graph().as_default()`: its variables hold no memory). A weight at a
    time, and the table `base_precision.TABLE_ROWS` rows at a time, so that beside the stored
    values at most one float32 slice is held (Gemma 3 1B's table is 1.2 GB in float32, and each
    step of its quantization as much again; docs/models.md has the peaks).

    >>> import numpy as np
    >>> config = Gemma3BackboneConfig(vocabulary_size=32, num_layers=2, num_query_heads=2,
    ...     num_key_value_heads=1, hidden_dim=8, intermediate_dim=16, head_dim=4,
    ...     sliding_window=3, global_layer_every=2)
    >>> backbone = Gemma3Backbone(config, initializer="zeros", base_dtype="int8")
    >>> values = random_values(backbone)
    >>> sorted({values[v.ref()].dtype.name for v in backbone.weights})
    ['float32', 'int8']
    >>> [bool(np.array_equal(values[v.ref()], random_values(backbone)[v.ref()]))
    ...  for v in backbone.weights[:2]]
    [True, True]
    """
    import numpy as np

    rng = np.random.default_rng(seed)
    scales = base_precision.int8_scales(backbone)
    scale_ids = {id(scale) for scale in scales.values()}
    norms = {id(layer.scale) for layer in backbone.submodules
             if isinstance(layer, Gemma3RMSNorm)}
    table = backbone.token_embedding.embeddings
    values = {}
    for variable in backbone.weights:
        if id(variable) in scale_ids:   # set with its kernel
            continue
        shape = tuple(int(d) for d in variable.shape)
        if id(variable) in norms:
            values[variable.ref()] = np.ones(shape, variable.dtype.as_numpy_dtype)
            continue
        if variable is table:
            def rows(start, stop, width=shape[1]):
                return rng.standard_normal((stop - start, width), np.float32) * np.float32(0.02)
            step = base_precision.TABLE_ROWS
        elif len(shape) >= 2:
            field = math.prod(shape[:-2])
            limit = np.float32(math.sqrt(6.0 / (shape[-2] * field + shape[-1] * field)))

            def rows(start, stop, rest=shape[1:], limit=limit):   # U[0, 1) → [−a, a)
                return rng.random((stop - start,) + rest, np.float32) * (2 * limit) - limit
            step = shape[0]   # a kernel whole: its int8 blocks may run along its rows
        else:
            raise ValueError(f"{variable.name}: no random draw for a weight of shape {shape}")
        values.update(base_precision.stored_in_slices(variable, scales.get(id(variable)), rows,
                                                      step))
    return values
