"""A TFF TensorFlow computation as an in-process TensorFlow function.

A `tff.tensorflow.computation` is stored as a `computation.proto` whose `tensorflow` field holds a
`GraphDef` and *bindings*: which graph tensors are the parameter's leaves (a placeholder per
tensor, a `tf.variant` placeholder per dataset), which are the result's leaves, the name of the
op that initializes the graph's variables, and a session-token placeholder. TFF's C++ worker runs
that graph in a `tf.Session`: it feeds the parameter placeholders, runs the initializer, then
fetches the results.

`TensorFlowFunction` runs the very same `GraphDef` in the calling process: the graph is imported
once into a `tf.compat.v1.wrap_function` graph, with a control dependency on the initializer for
every op that is not one of its ancestors (so each call initializes the variables first, as each
TFF call does in a fresh session), and pruned to a concrete function from the parameter
placeholders to the result tensors. Calling it under `tf.device(d)` places the ops on device d
(ops without a kernel there, such as the dataset ops, fall back to the host by soft placement).

Values: a tensor leaf is anything `tf.convert_to_tensor` takes; a dataset leaf is a
`tf.data.Dataset` (or a list of elements, as TFF accepts) and is fed as its variant tensor;
a dataset result comes back as a `tf.data.Dataset`. Structures follow TFF's
`tff.structure.Struct` of the computation's type.

Example:

>>> import tensorflow as tf, tensorflow_federated as tff
>>> @tff.tensorflow.computation(tff.TensorType(np.float32, [2]))
... def double(x):
...     return x * 2.0
>>> fn = TensorFlowFunction.from_computation(double)
>>> fn(tf.constant([1.0, 2.5])).numpy().tolist()
[2.0, 5.0]
"""

from __future__ import annotations

import itertools

import tensorflow as tf
from tensorflow_federated.proto.v0 import computation_pb2

from tffl.runtime.tff_internals import (
    building_blocks,
    computation_types,
    structure,
    type_conversions,
    type_serialization,
)

_SHARED_NAME_SUFFIX = itertools.count()


def _tensor_names(binding: computation_pb2.TensorFlow.Binding) -> list[str]:
    """The graph tensor names of `binding`'s leaves, depth first (TFF's order)."""
    kind = binding.WhichOneof("binding")
    if kind == "tensor":
        return [binding.tensor.tensor_name]
    if kind == "sequence":
        which = binding.sequence.WhichOneof("binding")
        if which != "variant_tensor_name":
            raise ValueError(f"unsupported dataset binding {which!r} (TFF 0.87 writes variants)")
        return [binding.sequence.variant_tensor_name]
    if kind == "struct":
        return [n for element in binding.struct.element for n in _tensor_names(element)]
    raise ValueError(f"unsupported TensorFlow binding {kind!r}")


def _leaf_types(type_spec: computation_types.Type | None) -> list[computation_types.Type]:
    """TensorType / SequenceType leaves of `type_spec`, in the order of `_tensor_names`."""
    if type_spec is None:
        return []
    if isinstance(type_spec, computation_types.StructType):
        return [t for _, element in structure.iter_elements(type_spec) for t in _leaf_types(element)]
    return [type_spec]


def _leaf_values(value, type_spec: computation_types.Type | None) -> list:
    if type_spec is None:
        return []
    if isinstance(type_spec, computation_types.StructType):
        if not isinstance(value, structure.Struct):
            value = structure.from_container(value)
        return [v for (_, t), v in zip(structure.iter_elements(type_spec), value)
                for v in _leaf_values(v, t)]
    return [value]


def _as_dataset(value, type_spec: computation_types.SequenceType) -> tf.data.Dataset:
    if isinstance(value, tf.data.Dataset):
        return value
    if isinstance(value, list):  # TFF accepts a list of elements for a sequence
        element_spec = type_conversions.type_to_tf_tensor_specs(type_spec.element)
        return tf.data.Dataset.from_generator(lambda: iter(value), output_signature=element_spec)
    raise TypeError(f"expected a tf.data.Dataset for {type_spec}, got {type(value).__name__}")


def _with_init_dependencies(graph_def: tf.compat.v1.GraphDef, init_op: str) -> tf.compat.v1.GraphDef:
    """`graph_def` where fetching any result first runs `init_op`, as a fresh TFF session does.

    A control dependency on `init_op` goes to each *frontier* op: one that is neither an ancestor
    of `init_op` nor a placeholder, and whose inputs all are. Every other op depends on some
    frontier op, hence on the initializer; ops inside a while loop's frame are never frontier
    (their inputs come through the loop's `Enter` ops), so no dependency crosses a frame."""
    nodes = {node.name: node for node in graph_def.node}

    def input_names(node):
        return [i.lstrip("^").split(":")[0] for i in node.input]

    ancestors, stack = set(), [init_op]
    while stack:
        name = stack.pop()
        if name in ancestors or name not in nodes:
            continue
        ancestors.add(name)
        stack.extend(input_names(nodes[name]))
    settled = ancestors | {n for n, node in nodes.items() if node.op == "Placeholder"}
    for node in graph_def.node:
        if node.name not in settled and all(i in settled for i in input_names(node)):
            node.input.append("^" + init_op)
    return graph_def


def _uniquify_shared_names(graph_def: tf.compat.v1.GraphDef, suffix: str) -> tf.compat.v1.GraphDef:
    """Distinct resource names per imported computation (TFF's C++ worker gives each session
    its own; in one process, two computations must not share a variable by name)."""
    for node in graph_def.node:
        shared = node.attr.get("shared_name")
        if shared is not None:
            shared.s = (shared.s or node.name.encode()) + b"_tffl" + suffix.encode()
    return graph_def


class TensorFlowFunction:
    """One TFF TensorFlow computation, callable in-process on `structure.Struct` / leaf values."""

    def __init__(self, proto: computation_pb2.Computation):
        if proto.WhichOneof("computation") != "tensorflow":
            raise ValueError(f"not a TensorFlow computation: {proto.WhichOneof('computation')}")
        self.type_signature = type_serialization.deserialize_type(proto.type)
        tensorflow = proto.tensorflow
        graph_def = tf.compat.v1.GraphDef()
        tensorflow.graph_def.Unpack(graph_def)
        graph_def = _uniquify_shared_names(graph_def, str(next(_SHARED_NAME_SUFFIX)))
        if tensorflow.initialize_op:
            graph_def = _with_init_dependencies(graph_def, tensorflow.initialize_op)
        parameter_type = self.type_signature.parameter
        self._parameter_types = _leaf_types(parameter_type)
        self._parameter_names = (_tensor_names(tensorflow.parameter)
                                 if parameter_type is not None else [])
        self._result_type = self.type_signature.result
        self._result_types = _leaf_types(self._result_type)
        result_names = _tensor_names(tensorflow.result)
        token = tensorflow.session_token_tensor_name

        def import_graph():
            input_map = {token: tf.constant("tffl-in-process")} if token else None
            tf.graph_util.import_graph_def(graph_def, input_map=input_map, name="")

        wrapped = tf.compat.v1.wrap_function(import_graph, signature=[])
        graph = wrapped.graph
        self._function = wrapped.prune(
            feeds=[graph.as_graph_element(n) for n in self._parameter_names],
            fetches=[graph.as_graph_element(n) for n in result_names],
        )

    @classmethod
    def from_computation(cls, computation) -> "TensorFlowFunction":
        """From a `tff.Computation` or a `building_blocks.CompiledComputation`."""
        if isinstance(computation, building_blocks.CompiledComputation):
            return cls(computation.proto)
        return cls(computation.to_building_block().proto)

    def __call__(self, arg=None):
        feeds = []
        for value, type_spec in zip(_leaf_values(arg, self.type_signature.parameter),
                                    self._parameter_types):
            if isinstance(type_spec, computation_types.SequenceType):
                feeds.append(tf.data.experimental.to_variant(_as_dataset(value, type_spec)))
            else:
                feeds.append(tf.convert_to_tensor(value, dtype=type_spec.dtype))
        outputs = self._function(*feeds)
        leaves = []
        for output, type_spec in zip(outputs, self._result_types):
            if isinstance(type_spec, computation_types.SequenceType):
                element_spec = type_conversions.type_to_tf_tensor_specs(type_spec.element)
                output = tf.data.experimental.from_variant(output, element_spec)
            leaves.append(output)
        return _rebuild(self._result_type, iter(leaves))


def _rebuild(type_spec: computation_types.Type, leaves):
    """The `structure.Struct` of `type_spec` (a leaf itself for a tensor or sequence type)."""
    if isinstance(type_spec, computation_types.StructType):
        return structure.Struct([(name, _rebuild(element, leaves))
                                 for name, element in structure.iter_elements(type_spec)])
    return next(leaves)
