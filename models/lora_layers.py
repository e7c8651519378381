"""LoRA wrappers for Keras `Dense` and `EinsumDense` layers.

A LoRA wrapper keeps the wrapped layer's kernel W0 (and bias b) frozen and adds a low-rank update
in the row-vector convention of the RoLoRA paper (`shared/specs/rolora.md` §1.1):

    y = act(x·W0 + b + (α/r)·drop(x)·A·B)

- A ∈ R^{d_in×r}: down-projection, role `lora_a`, random from `seed` (default: PEFT's
  uniform(−1/√d_in, 1/√d_in), i.e. kaiming-uniform with a=√5).
- B ∈ R^{r×d_out}: up-projection, role `lora_b`, zeros, so at initialization y equals the
  wrapped layer's output exactly.
- W0, b: role `frozen`; the wrapped layer is set non-trainable.
- `tffl.engine.roles.link_lora(A, B, W0, α/r)` records which kernel the factors adapt (FLoRA needs it).

For `EinsumDense` (e.g. BERT's attention query, kernel (hidden, heads, head_dim) with equation
`abc,cde->abde`, or the attention output, kernel (heads, head_dim, hidden) with `abcd,cde->abe`),
the kernel's input axes (those shared with the input) are flattened into d_in and its output axes
into d_out; the LoRA path reshapes x (..., *in_dims) → (..., d_in), computes (..., d_out) and
reshapes it back to (..., *out_dims). The bias stays frozen.

`merge()` folds the update into the frozen kernel (W0 ← W0 + (α/r)·A·B, reshaped to the kernel's
shape) and skips the LoRA path; `unmerge()` undoes it. Merging is a Python-level switch: re-trace
any `tf.function` that called the layer before the switch.
"""

import math

import numpy as np
import tensorflow as tf

from models import base_precision
from tffl.engine import roles


def _default_a_initializer(d_in: int, seed):
    bound = 1.0 / math.sqrt(d_in)
    return tf.keras.initializers.RandomUniform(-bound, bound, seed=seed)


class LoraLayer(tf.keras.layers.Wrapper):
    """Base class of the LoRA wrappers; see the module docstring for the math.

    Subclasses define `_kernel_split()` (d_in, d_out, out_dims), `_base(x)` (pre-activation
    output of the frozen layer) and `_delta(x)` (x·A·B reshaped to the layer's output shape).
    """

    def __init__(
        self,
        layer: tf.keras.layers.Layer,
        rank: int,
        alpha: float | None = None,
        dropout: float = 0.0,
        seed: int | None = None,
        a_initializer=None,
        **kwargs,
    ):
        if not isinstance(rank, (int, np.integer)) or isinstance(rank, bool) or rank <= 0:
            raise ValueError(f"LoRA rank must be a positive integer, got rank={rank!r}.")
        if not 0.0 <= dropout < 1.0:
            raise ValueError(f"LoRA dropout must be in [0, 1), got dropout={dropout!r}.")
        kwargs.setdefault("name", f"{layer.name}_lora")
        super().__init__(layer, **kwargs)
        self.rank = int(rank)
        self.alpha = float(rank if alpha is None else alpha)
        self.dropout = float(dropout)
        self.seed = seed
        self.a_initializer = (
            None if a_initializer is None else tf.keras.initializers.get(a_initializer)
        )
        self.scale = self.alpha / self.rank
        self.merged = False
        self._dropout_layer = tf.keras.layers.Dropout(self.dropout, seed=seed)
        self.lora_a = None
        self.lora_b = None
        if layer.built:
            self.build(None)

    # -- to be provided by subclasses -------------------------------------------------------
    def _kernel_split(self) -> tuple[int, int, tuple[int, ...]]:
        raise NotImplementedError

    def _base(self, x):
        raise NotImplementedError

    def _delta(self, x):
        raise NotImplementedError

    # -- shared machinery -------------------------------------------------------------------
    @property
    def d_in(self) -> int:
        return self._kernel_split()[0]

    @property
    def d_out(self) -> int:
        return self._kernel_split()[1]

    def build(self, input_shape=None):
        if self.lora_a is not None:
            return
        if not self.layer.built:
            if input_shape is None:
                raise ValueError(f"Cannot build {self.name!r}: wrapped layer is not built.")
            self.layer.build(input_shape)
        d_in, d_out, _ = self._kernel_split()
        if self.rank > min(d_in, d_out):
            raise ValueError(
                f"LoRA rank={self.rank} exceeds min(d_in, d_out)=min({d_in}, {d_out}) for layer "
                f"{self.layer.name!r}."
            )
        self.layer.trainable = False
        for variable in self.layer.weights:
            roles.tag(variable, roles.FROZEN)
        # float32 beside a base stored in bfloat16 (`models.base_precision`).
        dtype = base_precision.trained_dtype(self.layer)
        a_init = self.a_initializer or _default_a_initializer(d_in, self.seed)
        with tf.name_scope(self.name):
            self.lora_a = self.add_weight(
                name="lora_a", shape=(d_in, self.rank), initializer=a_init, dtype=dtype,
                trainable=True,
            )
            self.lora_b = self.add_weight(
                name="lora_b", shape=(self.rank, d_out), initializer="zeros", dtype=dtype,
                trainable=True,
            )
        roles.tag(self.lora_a, roles.LORA_A)
        roles.tag(self.lora_b, roles.LORA_B)
        # Tells tffl which frozen kernel (A, B) adapt (FLoRA merges scale·A·B into it).
        roles.link_lora(self.lora_a, self.lora_b, self.layer.kernel, self.scale)
        self.built = True

    def call(self, inputs, training=None):
        outputs = self._base(inputs)
        if not self.merged:
            x = self._dropout_layer(inputs, training=training) if self.dropout else inputs
            outputs = outputs + self.scale * self._delta(x)
        if self.layer.activation is not None:
            outputs = self.layer.activation(outputs)
        return outputs

    def compute_output_shape(self, input_shape):
        return self.layer.compute_output_shape(input_shape)

    def delta_kernel(self) -> tf.Tensor:
        """(α/r)·A·B reshaped to the wrapped kernel's shape."""
        return tf.reshape(self.scale * tf.matmul(self.lora_a, self.lora_b), self.layer.kernel.shape)

    def merge(self) -> None:
        """W0 ← W0 + (α/r)·A·B; the LoRA path is then skipped. No-op if already merged."""
        if not self.merged:
            kernel = self.layer.kernel
            if kernel.dtype.is_integer:
                raise ValueError(f"LoRA of {self.layer.name!r} cannot merge into its int8 "
                                 "kernel (a quantized base); keep the adapters apart or load "
                                 "the base at float32")
            kernel.assign_add(tf.cast(self.delta_kernel(), kernel.dtype))
            self.merged = True

    def unmerge(self) -> None:
        """W0 ← W0 − (α/r)·A·B; the LoRA path is used again. No-op if not merged."""
        if self.merged:
            kernel = self.layer.kernel
            kernel.assign_sub(tf.cast(self.delta_kernel(), kernel.dtype))
            self.merged = False

    def get_config(self):
        config = super().get_config()
        config.update(
            {
                "rank": self.rank,
                "alpha": self.alpha,
                "dropout": self.dropout,
                "seed": self.seed,
                "a_initializer": (
                    None if self.a_initializer is None
                    else tf.keras.initializers.serialize(self.a_initializer)
                ),
            }
        )
        return config


@tf.keras.utils.register_keras_serializable(package="tffl")
class LoraDense(LoraLayer):
    """LoRA around a `tf.keras.layers.Dense`: y = act(x·W0 + b + (α/r)·drop(x)·A·B).

    Shapes: x (..., d_in) → y (..., d_out); W0 (d_in, d_out), A (d_in, r), B (r, d_out).

    Args:
      layer: the `Dense` layer to adapt (its weights become frozen).
      rank: r, with 0 < r ≤ min(d_in, d_out).
      alpha: α (default r, i.e. scale 1).
      dropout: dropout rate applied to x on the LoRA path only.
      seed: seed of A's initializer (and of the dropout).
      a_initializer: optional Keras initializer for A.

    Example:

    >>> dense = tf.keras.layers.Dense(8)
    >>> dense.build((None, 16))
    >>> lora = LoraDense(dense, rank=2, alpha=4.0, seed=0)
    >>> lora(tf.ones((3, 16))).shape
    TensorShape([3, 8])
    >>> [roles.role_of(v) for v in (lora.lora_a, lora.lora_b)]
    ['lora_a', 'lora_b']
    """

    def __init__(self, layer, rank, **kwargs):
        if not isinstance(layer, tf.keras.layers.Dense):
            raise ValueError(f"LoraDense wraps a Dense layer, got {type(layer).__name__}.")
        super().__init__(layer, rank, **kwargs)

    def _kernel_split(self):
        d_in, d_out = (int(d) for d in self.layer.kernel.shape)
        return d_in, d_out, (d_out,)

    def _base(self, x):
        # Same operations as Dense.call, so that B = 0 reproduces its output bit for bit.
        if x.shape.rank == 2:
            outputs = tf.matmul(a=x, b=base_precision.kernel_value(self.layer))
        else:
            outputs = tf.tensordot(x, base_precision.kernel_value(self.layer),
                                   [[x.shape.rank - 1], [0]])
        if self.layer.use_bias:
            outputs = tf.nn.bias_add(outputs, self.layer.bias)
        return outputs

    def _delta(self, x):
        if x.shape.rank == 2:
            return tf.matmul(tf.matmul(x, self.lora_a), self.lora_b)
        hidden = tf.tensordot(x, self.lora_a, [[x.shape.rank - 1], [0]])
        return tf.tensordot(hidden, self.lora_b, [[x.shape.rank - 1], [0]])


def _split_equation(equation: str, kernel_rank: int | None = None) -> tuple[int, int]:
    """Number of kernel input axes and output axes for a LoRA-compatible einsum equation.

    Compatible means `<batch><kin>,<kin><kout>-><batch><kout>`: the kernel's input axes are the
    input's trailing axes, its output axes are the output's trailing axes, both in kernel order.
    """
    if "..." in equation or "->" not in equation or "," not in equation:
        raise ValueError(f"Unsupported EinsumDense equation for LoRA: {equation!r}.")
    lhs, out = equation.split("->")
    inp, ker = lhs.split(",")
    k_in = "".join(c for c in ker if c in inp)
    k_out = "".join(c for c in ker if c in out and c not in inp)
    ok = (
        (kernel_rank is None or len(ker) == kernel_rank)
        and ker == k_in + k_out
        and k_in and k_out
        and inp.endswith(k_in)
        and out.endswith(k_out)
        and inp[: len(inp) - len(k_in)] == out[: len(out) - len(k_out)]
    )
    if not ok:
        raise ValueError(
            f"Unsupported EinsumDense equation for LoRA: {equation!r} (expected "
            "'<batch><in>,<in><out>-><batch><out>')."
        )
    return len(k_in), len(k_out)


@tf.keras.utils.register_keras_serializable(package="tffl")
class LoraEinsumDense(LoraLayer):
    """LoRA around a `tf.keras.layers.EinsumDense` (e.g. BERT's attention projections).

    With kernel shape (*in_dims, *out_dims): d_in = prod(in_dims), d_out = prod(out_dims) and

        y = act(einsum(eq, x, W0) + b + (α/r)·reshape(reshape(drop(x), (..., d_in))·A·B,
                                                      (..., *out_dims)))

    Example (the query projection of a 4-head attention with hidden size 16):

    >>> query = tf.keras.layers.EinsumDense("abc,cde->abde", output_shape=(None, 4, 4),
    ...                                     bias_axes="de")
    >>> query.build((None, 5, 16))
    >>> lora = LoraEinsumDense(query, rank=2, seed=0)
    >>> (lora.d_in, lora.d_out), lora(tf.ones((2, 5, 16))).shape
    ((16, 16), TensorShape([2, 5, 4, 4]))
    """

    def __init__(self, layer, rank, **kwargs):
        if not isinstance(layer, tf.keras.layers.EinsumDense):
            raise ValueError(f"LoraEinsumDense wraps an EinsumDense, got {type(layer).__name__}.")
        _split_equation(layer.equation)
        super().__init__(layer, rank, **kwargs)

    def _kernel_split(self):
        shape = [int(d) for d in self.layer.kernel.shape]
        n_in, _ = _split_equation(self.layer.equation, len(shape))
        in_dims, out_dims = shape[:n_in], shape[n_in:]
        return int(np.prod(in_dims)), int(np.prod(out_dims)), tuple(out_dims)

    def _base(self, x):
        outputs = tf.einsum(self.layer.equation, x, base_precision.kernel_value(self.layer))
        if self.layer.bias is not None:
            outputs += self.layer.bias
        return outputs

    def _delta(self, x):
        shape = [int(d) for d in self.layer.kernel.shape]
        n_in, _ = _split_equation(self.layer.equation, len(shape))
        d_in, d_out, out_dims = self._kernel_split()
        batch_shape = tf.shape(x)[: x.shape.rank - n_in]
        flat = tf.reshape(x, tf.concat([batch_shape, [d_in]], axis=0))
        hidden = tf.tensordot(flat, self.lora_a, [[flat.shape.rank - 1], [0]])
        delta = tf.tensordot(hidden, self.lora_b, [[hidden.shape.rank - 1], [0]])
        return tf.reshape(delta, tf.concat([batch_shape, list(out_dims)], axis=0))


def kernel_dims(layer: tf.keras.layers.Layer) -> tuple[int, int]:
    """(d_in, d_out) that LoRA would use for a built `Dense` or `EinsumDense` layer.

    Example:

    >>> dense = tf.keras.layers.Dense(4)
    >>> dense.build((None, 6))
    >>> kernel_dims(dense)
    (6, 4)
    """
    if isinstance(layer, tf.keras.layers.EinsumDense):
        shape = [int(d) for d in layer.kernel.shape]
        n_in, _ = _split_equation(layer.equation, len(shape))
        return int(np.prod(shape[:n_in])), int(np.prod(shape[n_in:]))
    if isinstance(layer, tf.keras.layers.Dense):
        return int(layer.kernel.shape[0]), int(layer.kernel.shape[1])
    raise ValueError(f"LoRA supports Dense and EinsumDense layers, got {type(layer).__name__}.")


def wrap_with_lora(layer: tf.keras.layers.Layer, rank: int, **kwargs) -> LoraLayer:
    """`LoraDense` or `LoraEinsumDense` around `layer`, depending on its type.

    Example:

    >>> dense = tf.keras.layers.Dense(4)
    >>> dense.build((None, 4))
    >>> type(wrap_with_lora(dense, rank=1)).__name__
    'LoraDense'
    """
    if isinstance(layer, tf.keras.layers.EinsumDense):
        return LoraEinsumDense(layer, rank, **kwargs)
    if isinstance(layer, tf.keras.layers.Dense):
        return LoraDense(layer, rank, **kwargs)
    raise ValueError(f"LoRA supports Dense and EinsumDense layers, got {type(layer).__name__}.")
