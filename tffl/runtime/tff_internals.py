"""Every private `tensorflow_federated.python.*` module tffl uses, in one place, behind a version
check.

`tffl.runtime` drives TFF below its public API (the worker contexts, the gRPC stubs, the
interpreter of TFF's building blocks, the multi-worker split): those modules are not part of
TFF's API and change between releases, so tffl supports exactly the release it was written
against. Another release fails here, at import, with one line saying so, instead of deep inside
a run. The rest of `tffl.runtime` imports these names from this module only.

>>> SUPPORTED_TFF_VERSION
'0.87.0'
"""

import tensorflow_federated as tff

SUPPORTED_TFF_VERSION = "0.87.0"


class UnsupportedTFFVersionError(ImportError):
    """The installed tensorflow-federated is not the release `tffl.runtime` supports."""


def check_version(version: str) -> None:
    """Raises `UnsupportedTFFVersionError` unless `version` is `SUPPORTED_TFF_VERSION`.

    >>> check_version("0.88.0")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    tffl.runtime.tff_internals.UnsupportedTFFVersionError: tffl.runtime needs ... but 0.88.0 is...
    """
    if version != SUPPORTED_TFF_VERSION:
        raise UnsupportedTFFVersionError(
            f"tffl.runtime needs tensorflow-federated=={SUPPORTED_TFF_VERSION} (it uses TFF's "
            f"internal modules, which change between releases), but {version} is installed; run "
            "`uv sync --locked` (pyproject.toml pins it)")


check_version(tff.__version__)

# The imports below are the private surface; keep them sorted by module.

from tensorflow_federated.python.common_libs import async_utils  # noqa: E402, E501, F401
from tensorflow_federated.python.common_libs import structure  # noqa: E402, E501, F401
from tensorflow_federated.python.core.backends.native import compiler as native_compiler  # noqa: E402, E501, F401
from tensorflow_federated.python.core.backends.native import mergeable_comp_compiler  # noqa: E402, E501, F401
from tensorflow_federated.python.core.environments.tensorflow_backend import tensorflow_tree_transformations  # noqa: E402, E501, F401
from tensorflow_federated.python.core.environments.tensorflow_frontend import tensorflow_computation  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.compiler import building_block_factory  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.compiler import building_blocks  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.compiler import intrinsic_defs  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.compiler import transformation_utils  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.compiler import transformations  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.computation import computation_impl  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.context_stack import context_base  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.context_stack import context_stack_impl  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.context_stack import runtime_error_context  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.execution_contexts import async_execution_context  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.execution_contexts import compiler_pipeline  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.execution_contexts import mergeable_comp_execution_context  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.execution_contexts import sync_execution_context  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.executor_stacks import python_executor_stacks  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.executors import cardinalities_utils  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.executors import remote_executor  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.executors import remote_executor_grpc_stub  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.executors import remote_executor_stub  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.executors import value_serialization  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.types import computation_types  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.types import placements  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.types import type_analysis  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.types import type_conversions  # noqa: E402, E501, F401
from tensorflow_federated.python.core.impl.types import type_serialization  # noqa: E402, E501, F401
