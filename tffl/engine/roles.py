"""Variable roles: the one vocabulary `tffl` uses to decide what is trained, sent and kept.

Every algorithm in `tffl` is a round loop parameterized by *which variables* clients train, upload
and keep (see `shared/specs/DESIGN.md`). `tffl` never imports model code; instead each Keras variable
carries a role:

| role        | meaning                                                          |
|-------------|------------------------------------------------------------------|
| `frozen`    | pretrained backbone weights, never trained                        |
| `lora_a`    | LoRA down-projection A, shape (d_in, r)                           |
| `lora_b`    | LoRA up-projection B, shape (r, d_out); zero at initialization   |
| `shared`    | trainable representation that is not LoRA (aggregated)           |
| `head`      | personal classifier (personalized algorithms keep it on-client)  |
| `shortcut`  | AdaptPFL's personal shortcut branch (kept on-client)             |

A role is attached with `tag(variable, role)` (models do this when they build their weights). An
untagged variable gets a default: `frozen` when it is not trainable, else `shared`.

A LoRA layer also declares which frozen kernel its factors adapt, with
`link_lora(lora_a, lora_b, base_kernel, scale)`: the layer computes x·W0 + scale·x·A·B where W0 is
`base_kernel` viewed as a (d_in, d_out) matrix (its leading axes flattened into d_in). Algorithms
that merge the adapter into the base weights (FLoRA) need that link; `lora_link(lora_a)` reads it.

Example:

>>> layer = tf.keras.layers.Dense(2)
>>> layer.build((None, 3))
>>> tag_layer(layer, HEAD)
>>> [role_of(v) for v in layer.weights]
['head', 'head']
"""

import dataclasses
from collections.abc import Iterable, Sequence

import tensorflow as tf

FROZEN = "frozen"
LORA_A = "lora_a"
LORA_B = "lora_b"
SHARED = "shared"
HEAD = "head"
SHORTCUT = "shortcut"
ROLES = (FROZEN, LORA_A, LORA_B, SHARED, HEAD, SHORTCUT)
# Roles that never leave a client in personalized algorithms.
PERSONAL_ROLES = (HEAD, SHORTCUT)

_ATTR = "_tffl_role"
_LINK_ATTR = "_tffl_lora_link"


@dataclasses.dataclass(frozen=True, eq=False)
class LoraLink:
    """The adapter (A = `lora_a`, B = `lora_b`) of the frozen `base_kernel` W0, applied as
    W0 + scale·A·B (A·B reshaped to W0's shape)."""

    lora_a: tf.Variable
    lora_b: tf.Variable
    base_kernel: tf.Variable
    scale: float


def _check_role(role: str) -> str:
    if role not in ROLES:
        raise ValueError(f"Unknown variable role {role!r}; expected one of {', '.join(ROLES)}.")
    return role


def tag(variable: tf.Variable, role: str) -> tf.Variable:
    """Attaches `role` to `variable` and returns the variable."""
    setattr(variable, _ATTR, _check_role(role))
    return variable


def tag_layer(layer: tf.keras.layers.Layer, role: str) -> None:
    """Tags every trainable weight of a built `layer` with `role` (non-trainable ones `frozen`)."""
    _check_role(role)
    if not layer.built:
        raise ValueError(f"Layer {layer.name!r} is not built yet; build it before tagging roles.")
    for variable in layer.trainable_weights:
        tag(variable, role)
    for variable in layer.non_trainable_weights:
        tag(variable, FROZEN)


def link_lora(lora_a: tf.Variable, lora_b: tf.Variable, base_kernel: tf.Variable,
              scale: float) -> None:
    """Records on `lora_a` that (A, B) adapt `base_kernel`: W = W0 + scale·A·B.

    Shapes: A (d_in, r), B (r, d_out), base_kernel any shape with d_in·d_out elements whose
    row-major reshape to (d_in, d_out) is the matrix the layer multiplies (true for `Dense` and for
    `EinsumDense` kernels (*in_dims, *out_dims)).

    Raises:
      ValueError: if the shapes do not fit together.
    """
    a_shape, b_shape = tuple(lora_a.shape.as_list()), tuple(lora_b.shape.as_list())
    size = base_kernel.shape.num_elements()
    if (len(a_shape) != 2 or len(b_shape) != 2 or a_shape[1] != b_shape[0]
            or size != a_shape[0] * b_shape[1]):
        raise ValueError(f"cannot link LoRA factors {a_shape}, {b_shape} to a base kernel of "
                         f"shape {tuple(base_kernel.shape.as_list())}")
    setattr(lora_a, _LINK_ATTR, LoraLink(lora_a, lora_b, base_kernel, float(scale)))


def lora_link(lora_a: tf.Variable) -> LoraLink | None:
    """The `LoraLink` recorded by `link_lora` on `lora_a`, or None."""
    return getattr(lora_a, _LINK_ATTR, None)


def role_of(variable: tf.Variable) -> str:
    """The role of `variable`: its tag, else `frozen` if not trainable, else `shared`."""
    role = getattr(variable, _ATTR, None)
    if role is not None:
        return role
    return SHARED if variable.trainable else FROZEN


def variables_by_role(variables: Iterable[tf.Variable]) -> dict[str, list[tf.Variable]]:
    """Groups `variables` by role, keeping their order; every role is a key (maybe empty)."""
    groups = {role: [] for role in ROLES}
    for variable in variables:
        groups[role_of(variable)].append(variable)
    return groups


def select(variables: Iterable[tf.Variable], roles: Sequence[str]) -> list[tf.Variable]:
    """The variables whose role is in `roles`, in their original order."""
    wanted = {_check_role(r) for r in roles}
    return [v for v in variables if role_of(v) in wanted]
