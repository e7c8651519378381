"""Gemma 3's decoder layer for Keras 2 (KerasNLP style): `Gemma3Decoder`, its attention and RMSNorm.

One layer maps hidden states x (B, T, H) to (B, T, H) with "sandwich" norms around both blocks:

    h   = x + post_attn_norm(Attention(attn_norm(x)))
    out = h + post_ffw_norm(W_down · (gelu_tanh(W_gate · n) ⊙ (W_up · n))),   n = ffn_norm(h)

RMSNorm(x) = x / sqrt(mean(x²) + ε) · w over the last axis, in float32. The weight w is used as
it is: Gemma's checkpoints store w − 1 and add 1 at run time, GGUF files store w (the +1 done),
and a random model starts at w = 1.

Attention, with N query heads, K key/value heads (N a multiple of K; query head u reads
key/value head ⌊u·K/N⌋: grouped-query attention) of width D:

    q_u = RoPE(RMSNorm_D(x W_q,u)) · s,   k_v = RoPE(RMSNorm_D(x W_k,v)),   v_v = x W_v,v
    a_u = softmax(q_u k_vᵀ + mask) v_v,   out = concat_u(a_u) W_o

W_q: (H, N, D), W_k, W_v: (H, K, D), W_o: (N·D, H); the query/key norms (QK-norm) are RMSNorms
over D with weights of shape (D,), shared by the heads; s is the query scale (D^-1/2 for Gemma 3
270M). RoPE rotates the two halves of each head vector ("NEOX" order): with
θ_i = base^(−2i/D), i < D/2, and position t,

    RoPE(z)[i] = z[i] cos(tθ_i) − z[i + D/2] sin(tθ_i),
    RoPE(z)[i + D/2] = z[i + D/2] cos(tθ_i) + z[i] sin(tθ_i).

Query t may read key j iff j ≤ t (causal), padding_mask[j] = 1, and, for a local
(sliding-window) layer with window W, t − j < W. Gemma 3 alternates five local layers
(RoPE base 10⁴, W = 512) and one global layer (RoPE base 10⁶, no window).

Cached decoding (`call_with_cache` of `Gemma3Attention` and `Gemma3Decoder`): the keys (after
QK-norm and RoPE at their own positions) and values of the tokens seen so far stay in a cache
(B, 2, S, K, D) per layer, slot j of row b holding the key at position key_positions[b, j]. New
tokens compute only their own q, k, v, write k and v into their slots (`write_cache`), and attend
over the cache with the same rule (`cached_attention_mask`: key position ≤ query position and,
locally, within W), so a token's output is the uncached call's at its position, one position's
work per token instead of the whole sequence's. Rows of one batch may be at different positions.

The projections have the attribute names and kinds of KerasNLP's Llama decoder
(`_self_attention_layer._query_dense` .. `._output_dense`: EinsumDense;
`_feedforward_gate_dense`, `_feedforward_intermediate_dense` (up), `_feedforward_output_dense`:
Dense without bias), so `models.lora_targets.apply_lora` adapts all seven targets.

Example (one tiny random local layer):

>>> import numpy as np
>>> layer = Gemma3Decoder(Gemma3DecoderConfig(intermediate_dim=8, num_query_heads=2,
...                                           num_key_value_heads=1, head_dim=4,
...                                           sliding_window=2))
>>> x = np.random.default_rng(0).normal(size=(1, 5, 6)).astype("float32")
>>> layer(x, decoder_padding_mask=np.ones((1, 5), "int32")).shape
TensorShape([1, 5, 6])
>>> Gemma3Decoder.from_config(layer.get_config()).config == layer.config
True
>>> layer.config.query_scale                        # D^-1/2, filled in
0.5

The same layer on the last two positions, the first three in its cache (of 5 slots):

>>> import tensorflow as tf
>>> full = layer(x, decoder_padding_mask=np.ones((1, 5), "int32"))
>>> keys = np.array([[0, 1, 2, 3, 4]])     # slot j holds position j
>>> _, cache = layer.call_with_cache(x[:, :3], tf.zeros([1, 2, 5, 1, 4]), 0, keys[:, :3], keys)
>>> last, cache = layer.call_with_cache(x[:, 3:], cache, 3, keys[:, 3:], keys)
>>> bool(np.allclose(last, full[:, 3:], atol=1e-6))
True
"""

from __future__ import annotations

import contextlib

import dataclasses

import tensorflow as tf

from models import base_precision

_MASKED = -1e9


@tf.keras.utils.register_keras_serializable(package="tffl")
class Gemma3RMSNorm(tf.keras.layers.Layer):
    """x / sqrt(mean(x², last axis) + ε) · w, computed in float32; w (`scale`, shape (d,)) starts
    at 1 and is used as it is (no +1)."""

    def __init__(self, epsilon: float = 1e-6, **kwargs):
        super().__init__(**kwargs)
        self.epsilon = epsilon

    def build(self, input_shape):
        self.scale = self.add_weight(name="scale", shape=(input_shape[-1],),
                                     initializer="ones", trainable=True)
        self.built = True

    def call(self, x):
        x32 = tf.cast(x, tf.float32)
        mean_square = tf.reduce_mean(tf.square(x32), axis=-1, keepdims=True)
        normed = x32 * tf.math.rsqrt(mean_square + self.epsilon) * tf.cast(self.scale, tf.float32)
        return tf.cast(normed, self.compute_dtype)

    def get_config(self):
        return {**super().get_config(), "epsilon": self.epsilon}


@dataclasses.dataclass(frozen=True)
class Gemma3DecoderConfig:
    """One Gemma 3 decoder layer's architecture (module doc), what `Gemma3Decoder` and its
    `Gemma3Attention` take; `get_config()` holds it as a plain dict.

    Attributes:
      intermediate_dim: F, the width of the gated feed-forward block.
      num_query_heads, num_key_value_heads, head_dim: N, K, D (N a multiple of K).
      query_scale: s, multiplies the queries; None: D^-1/2 (filled in, as a float).
      rope_base: RoPE's base (10⁴ for Gemma 3's local layers, 10⁶ for its global ones).
      sliding_window: W for a local layer (query t reads keys t−W+1..t); None for a global one.
      layer_norm_epsilon: ε of the six RMSNorms and of the query/key norms.
    """

    intermediate_dim: int
    num_query_heads: int
    num_key_value_heads: int
    head_dim: int
    query_scale: float | None = None
    rope_base: float = 10_000.0
    sliding_window: int | None = None
    layer_norm_epsilon: float = 1e-6

    def __post_init__(self):
        scale = self.head_dim ** -0.5 if self.query_scale is None else self.query_scale
        object.__setattr__(self, "query_scale", float(scale))
        object.__setattr__(self, "rope_base", float(self.rope_base))
        if self.sliding_window is not None:
            object.__setattr__(self, "sliding_window", int(self.sliding_window))


def _config_from(layer_class, config: dict):
    """`layer_class` rebuilt from its `get_config()` (the `Gemma3DecoderConfig` as a dict)."""
    config = dict(config)
    return layer_class(Gemma3DecoderConfig(**config.pop("config")), **config)


def rotary_embedding(x: tf.Tensor, base: float, positions: tf.Tensor | None = None
                     ) -> tf.Tensor:
    """RoPE on x (B, T, heads, D), rotating halves (see the module doc): row b's vector t at
    position `positions[b, t]` ((B, T) int32; None: 0..T−1 in every row, the uncached call).

    >>> import numpy as np
    >>> x = np.random.default_rng(0).normal(size=(2, 3, 1, 4)).astype("float32")
    >>> shifted = rotary_embedding(x, 100.0, np.array([[0, 1, 2], [5, 6, 7]], np.int32))
    >>> bool(np.allclose(shifted[:1], rotary_embedding(x, 100.0)[:1], atol=1e-6))
    True
    >>> q, k = shifted[1], rotary_embedding(x, 100.0)[1]   # a dot product sees t − s only
    >>> bool(np.isclose(np.sum(q[2] * q[0]), np.sum(k[2] * k[0]), atol=1e-5))
    True
    """
    head_dim = x.shape[-1]
    inverse_freq = 1.0 / (base ** (tf.range(0, head_dim, 2, dtype=tf.float32) / head_dim))
    if positions is None:
        positions = tf.range(tf.shape(x)[1])[None, :]                      # (1, T)
    angles = tf.cast(positions, tf.float32)[:, :, None] * inverse_freq      # (B or 1, T, D/2)
    cos = tf.concat([tf.cos(angles)] * 2, axis=-1)[:, :, None, :]         # (B or 1, T, 1, D)
    sin = tf.concat([tf.sin(angles)] * 2, axis=-1)[:, :, None, :]
    first, second = tf.split(x, 2, axis=-1)
    return x * cos + tf.concat([-second, first], axis=-1) * sin


def attention_mask(padding_mask: tf.Tensor | None, length: tf.Tensor, batch: tf.Tensor,
                   sliding_window: int | None = None) -> tf.Tensor:
    """(B, T, T) bool: query t may read key j (causal, not padding, within the window)."""
    query = tf.range(length)[:, None]
    key = tf.range(length)[None, :]
    allowed = key <= query
    if sliding_window is not None:
        allowed &= query - key < sliding_window
    allowed = tf.broadcast_to(allowed[None], tf.stack([batch, length, length]))
    if padding_mask is not None:
        allowed &= tf.cast(padding_mask, tf.bool)[:, None, :]
    return allowed


def cached_attention_mask(positions: tf.Tensor, key_positions: tf.Tensor,
                          sliding_window: int | None = None) -> tf.Tensor:
    """(B, T, S) bool: with a key/value cache of S slots, row b's query t (at position
    positions[b, t]) may read slot j (holding the key at position key_positions[b, j]) iff

        key_positions[b, j] ≤ positions[b, t]   (causal; an empty slot or a padding token has a
                                                 key position later than every query's)
        positions[b, t] − key_positions[b, j] < W   (a local layer's window W).

    >>> import numpy as np
    >>> cached_attention_mask(np.array([[3]]), np.array([[0, 1, 2, 3, 9]]), 2).numpy()
    array([[[False, False,  True,  True, False]]])
    """
    query = tf.convert_to_tensor(positions)[:, :, None]
    key = tf.convert_to_tensor(key_positions)[:, None, :]
    allowed = key <= query
    if sliding_window is not None:
        allowed &= query - key < sliding_window
    return allowed


def write_cache(cache: tf.Tensor, update: tf.Tensor, cache_update_index) -> tf.Tensor:
    """cache (B, 2, S, K, D) (keys, values) with slots i..i+T−1 (i = `cache_update_index`)
    replaced by update (B, 2, T, K, D); the other slots kept.

    >>> import numpy as np
    >>> write_cache(np.zeros((1, 2, 4, 1, 1)), np.ones((1, 2, 2, 1, 1)), 1)[0, 0, :, 0, 0].numpy()
    array([0., 1., 1., 0.])
    """
    end = cache_update_index + tf.shape(update)[2]
    return tf.concat([cache[:, :, :cache_update_index], update, cache[:, :, end:]], axis=2)


@tf.keras.utils.register_keras_serializable(package="tffl")
class Gemma3Attention(tf.keras.layers.Layer):
    """Grouped-query attention with QK-norm, per-layer RoPE base and an optional sliding window
    (module doc), of the `Gemma3DecoderConfig` of its layer (its `intermediate_dim` unused),
    its four projections' kernels stored at `base_dtype` (`Gemma3Decoder`).
    `call(x (B, T, H), padding_mask (B, T) or None) -> (B, T, H)`; `call_with_cache` the same
    over a key/value cache (module doc).

    The mask is built here from the padding mask, not passed in: Keras 2, building a functional
    model in a TF1 graph (as TFF traces it), evaluates in a session every constant-valued tensor
    that reaches a layer call without Keras history (the mask's `range` and `shape`), and runs
    the model's variable initializers each time."""

    def __init__(self, config: Gemma3DecoderConfig, kernel_initializer="glorot_uniform",
                 base_dtype: str = "float32", **kwargs):
        super().__init__(**kwargs)
        if config.num_query_heads % config.num_key_value_heads:
            raise ValueError(f"num_query_heads={config.num_query_heads} is not a multiple of "
                             f"num_key_value_heads={config.num_key_value_heads}")
        base_precision.check_base_dtype(base_dtype)
        self.config = config
        self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)
        self.base_dtype = base_dtype

    def _einsum(self, equation, output_shape, name):
        return base_precision.projection(
            self.base_dtype, equation, output_shape=output_shape, name=name,
            kernel_initializer=self.kernel_initializer.__class__.from_config(
                self.kernel_initializer.get_config()))

    def build(self, input_shape):
        hidden_dim = input_shape[-1]
        # b batch, q/k query/key position, m model width, u query heads, v kv heads, h head dim.
        config = self.config
        heads, kv_heads, width = config.num_query_heads, config.num_key_value_heads, config.head_dim
        self._query_dense = self._einsum("bqm,muh->bquh", (None, heads, width), "query")
        self._key_dense = self._einsum("bkm,mvh->bkvh", (None, kv_heads, width), "key")
        self._value_dense = self._einsum("bkm,mvh->bkvh", (None, kv_heads, width), "value")
        self._output_dense = self._einsum("bqm,mh->bqh", (None, hidden_dim), "attention_output")
        for dense in (self._query_dense, self._key_dense, self._value_dense):
            dense.build(input_shape)
        self._output_dense.build((None, None, heads * width))
        self._query_norm = Gemma3RMSNorm(config.layer_norm_epsilon, name="query_norm")
        self._key_norm = Gemma3RMSNorm(config.layer_norm_epsilon, name="key_norm")
        self._query_norm.build((None, None, heads, width))
        self._key_norm.build((None, None, kv_heads, width))
        self.built = True

    def call(self, x, padding_mask=None):
        config = self.config
        shape = tf.shape(x)
        mask = attention_mask(padding_mask, shape[1], shape[0], config.sliding_window)
        query = rotary_embedding(self._query_norm(self._query_dense(x)), config.rope_base)
        key = rotary_embedding(self._key_norm(self._key_dense(x)), config.rope_base)
        value = self._value_dense(x)
        groups = config.num_query_heads // config.num_key_value_heads
        # Query head u reads kv head u // groups: repeat each kv head `groups` times.
        key = tf.repeat(key, groups, axis=2)
        value = tf.repeat(value, groups, axis=2)
        scores = tf.einsum("bquh,bkuh->buqk", query * config.query_scale, key)
        scores = tf.where(mask[:, None, :, :], scores, tf.cast(_MASKED, scores.dtype))
        weights = tf.nn.softmax(tf.cast(scores, tf.float32), axis=-1)
        attended = tf.einsum("buqk,bkuh->bquh", tf.cast(weights, value.dtype), value)
        shape = tf.shape(attended)
        attended = tf.reshape(attended,
                              [shape[0], shape[1], config.num_query_heads * config.head_dim])
        return self._output_dense(attended)

    def call_with_cache(self, x, cache, cache_update_index, positions, key_positions):
        """Attention of T new tokens over a key/value cache: `(out (B, T, H), cache)`.

        x (B, T, H) are the new tokens' inputs, at positions `positions` (B, T) int32 (RoPE's
        t). Their keys RoPE(RMSNorm_D(x W_k)) and values x W_v go into slots
        i..i+T−1 of `cache` (B, 2, S, K, D) (i = `cache_update_index`, `write_cache`), and
        each query reads the slots `cached_attention_mask(positions, key_positions, W)` allows,
        `key_positions` (B, S) int32 being the position of the key in each slot. The same
        projection layers as `call` (LoRA-wrapped ones included); the keys' heads are shared by
        groups of N/K query heads (query head u = v·N/K + g reads key/value head v) without
        repeating the cache. With S = T, i = 0, positions 0..T−1 and key positions 0..T−1 this
        is `call(x)` (up to float rounding).
        """
        config = self.config
        query = rotary_embedding(self._query_norm(self._query_dense(x)), config.rope_base,
                                 positions)
        key = rotary_embedding(self._key_norm(self._key_dense(x)), config.rope_base, positions)
        cache = write_cache(cache, tf.stack([key, self._value_dense(x)], axis=1),
                            cache_update_index)
        mask = cached_attention_mask(positions, key_positions, config.sliding_window)
        groups = config.num_query_heads // config.num_key_value_heads
        shape = tf.shape(query)
        # b batch, q query, k cache slot, v kv head, g query head in its group, h head dim.
        query = tf.reshape(query * config.query_scale, [shape[0], shape[1],
                                                        config.num_key_value_heads, groups,
                                                        config.head_dim])
        scores = tf.einsum("bqvgh,bkvh->bvgqk", query, cache[:, 0])
        scores = tf.where(mask[:, None, None, :, :], scores, tf.cast(_MASKED, scores.dtype))
        weights = tf.cast(tf.nn.softmax(tf.cast(scores, tf.float32), axis=-1), cache.dtype)
        attended = tf.einsum("bvgqk,bkvh->bqvgh", weights, cache[:, 1])
        attended = tf.reshape(attended,
                              [shape[0], shape[1], config.num_query_heads * config.head_dim])
        return self._output_dense(attended), cache

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config),
                "kernel_initializer": tf.keras.initializers.serialize(self.kernel_initializer),
                "base_dtype": self.base_dtype}

    @classmethod
    def from_config(cls, config):
        return _config_from(cls, config)


@tf.keras.utils.register_keras_serializable(package="tffl")
class Gemma3Decoder(tf.keras.layers.Layer):
    """One Gemma 3 decoder layer (module doc): `layer(x (B, T, H), decoder_padding_mask (B, T)
    or None, training=None) -> (B, T, H)`.

    Args:
      config: the layer's architecture (`Gemma3DecoderConfig`: F, N, K, D, s, RoPE base, W, ε).
      kernel_initializer: the starting weights of every projection.
      base_dtype: what the seven projections' kernels are stored at ("float32"; "bfloat16"
        halves them, "int8" stores them at 28% with a float32 scale per 32 inputs; read widened
        to float32 in the step: `models.base_precision`). The norms' weights stay float32.
    """

    def __init__(self, config: Gemma3DecoderConfig, kernel_initializer="glorot_uniform",
                 base_dtype: str = "float32", **kwargs):
        super().__init__(**kwargs)
        base_precision.check_base_dtype(base_dtype)
        self.config = config
        self.kernel_initializer = tf.keras.initializers.get(kernel_initializer)
        self.base_dtype = base_dtype

    def _norm(self, name, shape):
        norm = Gemma3RMSNorm(self.config.layer_norm_epsilon, name=name)
        norm.build(shape)
        return norm

    def _dense(self, units, name, input_shape):
        dense = base_precision.projection(
            self.base_dtype, units=units, use_bias=False, name=name,
            kernel_initializer=self.kernel_initializer.__class__.from_config(
                self.kernel_initializer.get_config()))
        dense.build(input_shape)
        return dense

    def build(self, input_shape):
        input_shape = tuple(input_shape)
        hidden_dim = input_shape[-1]
        intermediate_dim = self.config.intermediate_dim
        self._self_attention_layer = Gemma3Attention(self.config, self.kernel_initializer,
                                                     self.base_dtype, name="self_attention")
        self._self_attention_layer.build(input_shape)
        self._self_attention_norm = self._norm("self_attention_norm", input_shape)
        self._post_attention_norm = self._norm("post_attention_norm", input_shape)
        self._feedforward_norm = self._norm("feedforward_norm", input_shape)
        self._post_feedforward_norm = self._norm("post_feedforward_norm", input_shape)
        self._feedforward_gate_dense = self._dense(intermediate_dim, "feedforward_gate",
                                                   input_shape)
        self._feedforward_intermediate_dense = self._dense(
            intermediate_dim, "feedforward_up", input_shape)
        self._feedforward_output_dense = self._dense(
            hidden_dim, "feedforward_down", input_shape[:-1] + (intermediate_dim,))
        self.built = True

    def call(self, x, decoder_padding_mask=None, training=None):
        with self._widened_after(x):
            attended = self._self_attention_layer(self._self_attention_norm(x),
                                                  decoder_padding_mask)
            return self._feedforward_block(x + self._post_attention_norm(attended))

    def call_with_cache(self, x, cache, cache_update_index, positions, key_positions):
        """The layer on T new tokens with its attention's key/value cache (B, 2, S, K, D):
        `(out (B, T, H), cache)`, `Gemma3Attention.call_with_cache` for the arguments."""
        with self._widened_after(x):
            attended, cache = self._self_attention_layer.call_with_cache(
                self._self_attention_norm(x), cache, cache_update_index, positions,
                key_positions)
            return self._feedforward_block(x + self._post_attention_norm(attended)), cache

    def _widened_after(self, x):
        """In a graph, a lower-precision base's kernels read (widened to float32) only once the
        layer's input x is computed. A graph runs any op whose inputs are ready, and a frozen
        kernel's cast needs none of the step's data, so every layer's widened kernels were live
        at once as a pass began (the evaluation's prefix through 14 layers of Gemma 3 270M).
        A float32 base reads its kernels without a copy: nothing to order."""
        if self.base_dtype == "float32":
            return contextlib.nullcontext()
        return tf.control_dependencies([x])

    def _feedforward_block(self, h):
        """h + post_ffw_norm(W_down · (gelu_tanh(W_gate · n) ⊙ (W_up · n))), n = ffn_norm(h)."""
        n = self._feedforward_norm(h)
        gate = tf.keras.activations.gelu(self._feedforward_gate_dense(n), approximate=True)
        up = self._feedforward_intermediate_dense(n)
        return h + self._post_feedforward_norm(self._feedforward_output_dense(gate * up))

    def compute_output_shape(self, input_shape):
        return input_shape

    def get_config(self):
        return {**super().get_config(), "config": dataclasses.asdict(self.config),
                "kernel_initializer": tf.keras.initializers.serialize(self.kernel_initializer),
                "base_dtype": self.base_dtype}

    @classmethod
    def from_config(cls, config):
        return _config_from(cls, config)
