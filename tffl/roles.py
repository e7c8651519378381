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

Example:

>>> layer = tf.keras.layers.Dense(2)
>>> layer.build((None, 3))
>>> tag_layer(layer, HEAD)
>>> [role_of(v) for v in layer.weights]
['head', 'head']
"""

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
