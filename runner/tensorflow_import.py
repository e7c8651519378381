"""Importing TensorFlow at the right moment in an absl script, and telling when it was not.

TensorFlow 2.14's import registers `absl.app.call_after_init(...)`
(`tensorflow/python/distribute/combinations.py`). Before absl's `app.run` has parsed the flags,
absl queues that callback; once `app.run` is past its initialization, i.e. inside `main`, absl runs
it at once, in the middle of TensorFlow's own import, before TensorFlow has enabled eager
execution. The callback creates TensorFlow's eager context then, and that context never records
eager mode as its outermost state: from then on every `keras.Input` is a graph tensor, and building
any Keras functional model (a KerasNLP backbone, `tf.keras.Sequential`) fails with
"'SymbolicTensor' object has no attribute 'node'".

So a script whose `main` builds models imports TensorFlow in its flags parser, after its checks
(a bad flag still answers in a second) and before `main`:

    app.run(main, flags_parser=tensorflow_import.importing_tensorflow(cli.parse_flags))

and `runner.run.run` calls `check_eager_context()`, so that code embedding it in its own absl
`main` gets one line naming the cause instead of Keras' error. Nothing here imports TensorFlow at
module level.

Example (TensorFlow imported at the top of a program, as in this doctest, is always right):

>>> import tensorflow as tf
>>> import_tensorflow()
>>> check_eager_context()
>>> type(tf.keras.Input(shape=(3,))).__name__
'KerasTensor'
"""

from __future__ import annotations

from collections.abc import Callable


# TensorFlow's oneDNN CPU allocator keeps every large buffer it ever held in a pool that never
# shrinks (a BFC allocator), so a driver that once held a decoder's weights two or three times
# (loading a checkpoint, an evaluation) kept that much for the rest of the run: 3.5 GB through
# the rounds of a Gemma 3 270M run that needs 1.5 GB. With this variable set, oneDNN's kernels
# stay and the buffers come from the system allocator, which returns them.
SYSTEM_ALLOCATOR = "TF_ONEDNN_USE_SYSTEM_ALLOCATOR"
# `tffl.runtime.workers.DRIVER_ONLY_ENV`, named here without importing TensorFlow.
DRIVER_ONLY_ENV = "TFFL_DRIVER_ONLY_ENV"


def import_tensorflow() -> None:
    """Imports TensorFlow, then `tffl.runtime` (whose exit hook stops any TFF worker on every
    exit path). Call it before absl's `app.run` enters `main` (module docstring).

    This process's TensorFlow allocates from the system allocator (`SYSTEM_ALLOCATOR`, unless
    the environment sets it): TensorFlow reads the variable at its first operation, so it stays
    set, named in `DRIVER_ONLY_ENV` so that the TFF workers this process
    starts go without it and keep oneDNN's pool, which holds less in their steps
    (docs/PERFORMANCE.md, "What held the driver's memory")."""
    import importlib
    import os

    if SYSTEM_ALLOCATOR not in os.environ:
        os.environ[SYSTEM_ALLOCATOR] = "1"
        names = [n for n in os.environ.get(DRIVER_ONLY_ENV, "").split(",") if n]
        os.environ[DRIVER_ONLY_ENV] = ",".join([*names, SYSTEM_ALLOCATOR])
    # Imported for their effects: TensorFlow's absl hook, then tffl.runtime's exit hook.
    importlib.import_module("tensorflow")
    importlib.import_module("tffl.runtime")


def importing_tensorflow(parser: Callable[[list[str]], list[str]]
                         ) -> Callable[[list[str]], list[str]]:
    """The absl `flags_parser` that runs `parser(argv)` (its checks exit with status 2 before
    anything heavy), then `import_tensorflow()`, and returns what `parser` returned."""

    def parse_then_import(argv: list[str]) -> list[str]:
        rest = parser(argv)
        import_tensorflow()
        return rest

    return parse_then_import


def eager_context_is_sound() -> bool:
    """Whether a function graph built now sees eager execution outside it, as Keras needs
    (False after the import order of the module docstring)."""
    import tensorflow as tf

    if not tf.executing_eagerly():
        return True  # building a graph on purpose: Keras has its own graph rules there
    with tf.__internal__.FuncGraph("tffl_probe").as_default():
        return tf.compat.v1.executing_eagerly_outside_functions()


def check_eager_context() -> None:
    """Raises RuntimeError, one line naming the cause and the fix, if TensorFlow was first
    imported inside absl's `app.run` `main` (module docstring)."""
    if not eager_context_is_sound():
        raise RuntimeError(
            "TensorFlow was first imported inside absl's app.run main, so Keras cannot build "
            "models in this process; import tensorflow before app.run starts main (e.g. in the "
            "flags parser: runner.tensorflow_import.importing_tensorflow)")
