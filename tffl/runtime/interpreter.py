"""Evaluating a compiled TFF computation in-process, with its clients spread over devices.

TFF compiles a federated computation (`desugar_and_transform_to_native`, the pipeline its C++
worker receives) to a tree of building blocks: lambdas, blocks of named locals, calls, structs,
selections, references, TensorFlow computations and federated intrinsics. `Interpreter`
evaluates that tree in this Python process:

- a TensorFlow computation runs as `tf_functions.TensorFlowFunction`, i.e. its own serialized
  `GraphDef`, on one of the interpreter's devices;
- a SERVER-placed value is a value on the server device (`devices[0]`); a CLIENTS-placed value is
  a `ClientValues`, one member per client, client i living on the device of its replica;
- clients are cut into contiguous groups, one per replica (`replica_groups`, as
  `tffl.runtime.multi_worker.split_clients` cuts them over TFF workers), and `run_replicas` runs
  every replica's clients at once, each on its own device; within a replica, `clients_in_parallel`
  clients train at a time (threads with their own copies of the functions);
- the intrinsics the compiler leaves are evaluated by their TFF definition
  (`federated_broadcast`, `federated_map`, `federated_apply`, `federated_zip_*`,
  `federated_value_*`, `federated_eval_*`, `federated_aggregate`; TFF's compiler has reduced
  `federated_sum`, `federated_mean` and `federated_weighted_mean` to `federated_aggregate`).
  Anything else is an `UnsupportedComputationError` naming it.

`federated_aggregate(v, zero, accumulate, merge, report)` accumulates each replica's clients in
order on the replica's device, from `zero`, merges the replicas' accumulators in replica order on
the server device and reports: with one replica it adds in TFF's order; with several the partial
sums are added in another order (float rounding only), and an order-keeping accumulator (FLoRA's
stacking) stacks in client order because the groups are contiguous.

Values stay where they were computed: results are eager tensors on their devices, so a state
fed back into the next round does not leave the server device.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf

from tffl.runtime.tff_internals import (
    building_blocks,
    computation_types,
    intrinsic_defs,
    placements,
    structure,
)

from tffl.runtime.tf_functions import TensorFlowFunction


class UnsupportedComputationError(ValueError):
    """The computation uses an intrinsic or building block the in-process runtime lacks."""


@dataclasses.dataclass
class ClientValues:
    """A CLIENTS-placed value: `members[i]` is client i's (a single shared member if all_equal)."""

    members: list

    def __len__(self) -> int:
        return len(self.members)


def replica_groups(num_clients: int, num_replicas: int) -> list[range]:
    """Contiguous client groups, one per replica, sizes differing by at most one.

    >>> [list(g) for g in replica_groups(5, 2)]
    [[0, 1, 2], [3, 4]]
    """
    base, extra = divmod(num_clients, num_replicas)
    groups, start = [], 0
    for r in range(num_replicas):
        size = base + (1 if r < extra else 0)
        groups.append(range(start, start + size))
        start += size
    return groups


@dataclasses.dataclass
class _Closure:
    parameter_name: str | None
    body: building_blocks.ComputationBuildingBlock
    env: dict


def _placement(type_spec: computation_types.Type):
    return type_spec.placement if isinstance(type_spec, computation_types.FederatedType) else None


class Interpreter:
    """Evaluates compiled TFF building blocks over `devices`.

    Args:
      devices: device names, one per replica; `devices[0]` holds SERVER values.
      run_replicas: `run_replicas(fn)` calls `fn(r)` once per replica r, each under its device,
        concurrently (the strategy's replica run), and returns when all are done.
      num_clients: the CLIENTS cardinality when no argument says it (e.g. `initialize`).
      clients_in_parallel: P ≥ 1, clients each replica trains at once (threads; each of the P
        slots has its own instance of every TensorFlow function, hence its own variables). On a
        CPU, P > 1 keeps all cores busy as TFF's worker does; on an accelerator 1 is the usual.
    """

    def __init__(self, devices: Sequence[str], run_replicas: Callable[[Callable[[int], None]], None],
                 num_clients: int = 0, clients_in_parallel: int = 1):
        self.devices = list(devices)
        self.run_replicas = run_replicas
        self.num_clients = num_clients
        self.clients_in_parallel = max(1, int(clients_in_parallel))
        self._functions: dict[tuple[int, int, int], TensorFlowFunction] = {}
        self._keep: list = []  # keeps compiled blocks alive, so ids stay unique
        # Client calls per replica over this interpreter's life (what ran where).
        self.clients_per_replica = [0] * len(self.devices)

    # --- TensorFlow -------------------------------------------------------------------------
    def tensorflow(self, comp: building_blocks.CompiledComputation, replica: int, slot: int = 0):
        """The function of `comp` on `replica`'s device (one instance per device and parallel
        slot: its variables are that slot's own)."""
        key = (id(comp), replica, slot)
        fn = self._functions.get(key)
        if fn is None:
            fn = self._functions[key] = TensorFlowFunction(comp.proto)
            self._keep.append(comp)
        return fn

    def on_replica(self, value, replica: int):
        """`value` (a SERVER value) copied once to `replica`'s device."""
        if replica == 0:
            return value
        with tf.device(self.devices[replica]):
            return _map_leaves(value, lambda t: tf.identity(t) if tf.is_tensor(t) else t)

    # --- evaluation -------------------------------------------------------------------------
    def evaluate(self, comp: building_blocks.ComputationBuildingBlock, env: dict, replica: int = 0,
                 slot: int = 0):
        if isinstance(comp, building_blocks.Reference):
            return env[comp.name]
        if isinstance(comp, building_blocks.Lambda):
            return _Closure(comp.parameter_name, comp.result, env)
        if isinstance(comp, building_blocks.Block):
            env = dict(env)
            for name, value in comp.locals:
                env[name] = self.evaluate(value, env, replica, slot)
            return self.evaluate(comp.result, env, replica, slot)
        if isinstance(comp, building_blocks.Call):
            function = self.evaluate(comp.function, env, replica, slot)
            argument = (self.evaluate(comp.argument, env, replica, slot)
                        if comp.argument is not None else None)
            return self.call(function, argument, replica, slot)
        if isinstance(comp, building_blocks.Struct):
            return structure.Struct([(name, self.evaluate(element, env, replica, slot))
                                     for name, element in structure.iter_elements(comp)])
        if isinstance(comp, building_blocks.Selection):
            source = self.evaluate(comp.source, env, replica, slot)
            return _select(source, comp.as_index())
        if isinstance(comp, (building_blocks.CompiledComputation, building_blocks.Intrinsic)):
            return comp
        if isinstance(comp, building_blocks.Literal):
            with tf.device(self.devices[replica]):
                return tf.constant(comp.value, dtype=comp.type_signature.dtype)
        if isinstance(comp, building_blocks.Placement):
            return comp
        raise UnsupportedComputationError(
            f"the in-process runtime cannot evaluate a {type(comp).__name__} building block")

    def call(self, function, argument, replica: int = 0, slot: int = 0):
        if isinstance(function, _Closure):
            env = dict(function.env)
            if function.parameter_name is not None:
                env[function.parameter_name] = argument
            return self.evaluate(function.body, env, replica, slot)
        if isinstance(function, building_blocks.CompiledComputation):
            with tf.device(self.devices[replica]):
                return self.tensorflow(function, replica, slot)(argument)
        if isinstance(function, building_blocks.Intrinsic):
            return self.intrinsic(function, argument)
        if isinstance(function, _NoArgument):
            return self.call(function.function, None, replica, slot)
        raise UnsupportedComputationError(f"cannot call a {type(function).__name__}")

    # --- intrinsics -------------------------------------------------------------------------
    def intrinsic(self, intrinsic: building_blocks.Intrinsic, argument):
        uri = intrinsic.uri
        parameter = intrinsic.type_signature.parameter
        if uri == intrinsic_defs.FEDERATED_BROADCAST.uri:
            return ClientValues([argument])  # all equal: copied per replica when mapped
        if uri in (intrinsic_defs.FEDERATED_MAP.uri, intrinsic_defs.FEDERATED_MAP_ALL_EQUAL.uri,
                   intrinsic_defs.FEDERATED_APPLY.uri):
            function, value = argument[0], argument[1]
            if _placement(parameter[1]) is placements.SERVER:
                return self.call(function, value, 0)
            return self.map_clients(function, value)
        if uri == intrinsic_defs.FEDERATED_EVAL_AT_SERVER.uri:
            return self.call(argument, None, 0)
        if uri == intrinsic_defs.FEDERATED_EVAL_AT_CLIENTS.uri:
            return self.map_clients(_NoArgument(argument), ClientValues([None]))
        if uri == intrinsic_defs.FEDERATED_VALUE_AT_SERVER.uri:
            return argument
        if uri == intrinsic_defs.FEDERATED_VALUE_AT_CLIENTS.uri:
            return ClientValues([argument])
        if uri == intrinsic_defs.FEDERATED_ZIP_AT_SERVER.uri:
            return argument
        if uri == intrinsic_defs.FEDERATED_ZIP_AT_CLIENTS.uri:
            return self.zip_clients(argument, parameter)
        if uri == intrinsic_defs.FEDERATED_AGGREGATE.uri:
            value, zero, accumulate, merge, report = (argument[i] for i in range(5))
            return self.aggregate(value, zero, accumulate, merge, report)
        raise UnsupportedComputationError(
            f"the in-process runtime does not implement the intrinsic {uri!r}")

    def cardinality(self, value: ClientValues) -> int:
        if len(value) == 1 and self.num_clients > 1:
            return self.num_clients
        return len(value)

    def _members(self, value: ClientValues) -> list:
        n = self.cardinality(value)
        return value.members * n if len(value) == 1 and n > 1 else list(value.members)

    def map_clients(self, function, value: ClientValues) -> ClientValues:
        """`function` on each client's member, the replicas' groups concurrently."""
        members = self._members(value)
        results: list = [None] * len(members)
        groups = replica_groups(len(members), len(self.devices))
        shared = len(value) == 1 and len(members) > 1  # a broadcast: one copy per replica

        def run_group(r: int) -> None:
            if not groups[r]:
                return
            local = self.on_replica(members[0], r) if shared else None
            slots = min(self.clients_in_parallel, len(groups[r]))

            def run_slot(k: int) -> None:
                with tf.device(self.devices[r]):
                    for i in list(groups[r])[k::slots]:
                        results[i] = self.call(function, local if shared else members[i], r, k)

            if slots == 1:
                run_slot(0)
            else:
                with concurrent.futures.ThreadPoolExecutor(slots) as pool:
                    for future in [pool.submit(run_slot, k) for k in range(slots)]:
                        future.result()  # re-raises a client's error

        self.run_replicas(run_group)
        for r, group in enumerate(groups):
            self.clients_per_replica[r] += len(group)
        return ClientValues(results)

    def zip_clients(self, argument, parameter_type) -> ClientValues:
        names = [name for name, _ in structure.iter_elements(parameter_type)]
        columns = [self._members(v) for v in argument]
        n = max(len(c) for c in columns)
        columns = [c * n if len(c) == 1 and n > 1 else c for c in columns]
        return ClientValues([structure.Struct(list(zip(names, row))) for row in zip(*columns)])

    def aggregate(self, value: ClientValues, zero, accumulate, merge, report):
        members = self._members(value)
        groups = replica_groups(len(members), len(self.devices))
        partials: list = [None] * len(groups)

        def run_group(r: int) -> None:
            if not groups[r]:
                return
            acc = self.on_replica(zero, r)
            for i in groups[r]:
                acc = self.call(accumulate, structure.Struct.unnamed(acc, members[i]), r)
            partials[r] = acc

        self.run_replicas(run_group)
        filled = [p for p in partials if p is not None]
        if not filled:
            filled = [zero]
        total = self.on_server(filled[0])
        for partial in filled[1:]:
            total = self.call(merge, structure.Struct.unnamed(total, self.on_server(partial)), 0)
        return self.call(report, total, 0)

    def on_server(self, value):
        with tf.device(self.devices[0]):
            return _map_leaves(value, lambda t: tf.identity(t) if tf.is_tensor(t) else t)


class _NoArgument:
    """A no-argument function, called on each client (`federated_eval_at_clients`)."""

    def __init__(self, function):
        self.function = function


def _select(source, index: int):
    if isinstance(source, ClientValues):  # a selection on a zipped CLIENTS value
        return ClientValues([m[index] for m in source.members])
    return source[index]


def _map_leaves(value, fn):
    if isinstance(value, structure.Struct):
        return structure.Struct([(name, _map_leaves(v, fn))
                                 for name, v in structure.iter_elements(value)])
    if isinstance(value, (np.ndarray, np.generic, int, float)) or tf.is_tensor(value):
        return fn(tf.convert_to_tensor(value))
    return value
