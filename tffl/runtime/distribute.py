"""The in-process runtime: TFF computations executed under a `tf.distribute.Strategy`.

TFF 0.87's `worker_binary` is built without CUDA and without a TPU device factory, and the
Python runtimes that could place clients on accelerators were removed (0.55, DTensor in 0.81).
This runtime runs the same computations in the Python process instead, where TensorFlow sees the
GPUs or TPUs:

- `invoke` compiles a computation with TFF's own pipeline for its C++ worker
  (`desugar_and_transform_to_native`) and evaluates the result with `interpreter.Interpreter`:
  every TensorFlow computation is its serialized `GraphDef`, run by TensorFlow in-process;
- the strategy's replicas are the devices: each `federated_map` and `federated_aggregate` cuts
  the clients into one contiguous group per replica and runs the groups through `strategy.run`
  (MirroredStrategy runs its replicas concurrently, each under its device), each replica training
  `clients_in_parallel` clients at a time; SERVER values live on the first replica's device;
- arguments identical to the previous call's results (the state fed back into the next round)
  are not uploaded again: the device tensors they came from are used.

Select it with `distribute_runtime(devices)`, or `scripts/train.py --runtime=distribute
--devices=...`; `tffl.runtime.local_runtime()` (the TFF worker) stays the default and the
reference. Results equal the worker's up to float rounding (tests/tffl/runtime/test_distribute.py checks
every algorithm to 1e-5 over two rounds on 2 and 4 logical CPU devices; one device is
`OneDeviceStrategy`, tested in-process).

Personalized processes need nothing special: their rounds return the personal state at
CLIENTS, which the interpreter keeps as one member per client like any CLIENTS value; they never
go through a MapReduceForm.

Once per round kind (`report_round_devices`, called by `tffl.simulation.driver` after each
round), the runtime says on the `tffl` logger which devices the round's client steps ran on.

Devices: `devices` names TensorFlow logical devices (`"GPU:0,GPU:1"`, `"CPU:0"`), or `"tpu"`
(`"tpu:<name or grpc address>"`) for a TPU reached through `TPUClusterResolver`. Default: every
GPU TensorFlow sees, else the CPU. Verified on logical CPU devices only (no machine here has
TensorFlow on an accelerator).

Example:

>>> with distribute_runtime("CPU:0") as context:
...     context.strategy.num_replicas_in_sync
1
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
from collections.abc import Callable, Iterator

import numpy as np
import tensorflow as tf

from tffl.runtime.tff_internals import (
    compiler_pipeline,
    computation_types,
    context_base,
    context_stack_impl,
    native_compiler,
    placements,
    structure,
    type_conversions,
)

from tffl.runtime.interpreter import ClientValues, Interpreter


class _QuietEagerMirrored(logging.Filter):
    """Drops TensorFlow's per-call warning that MirroredStrategy runs eagerly: this runtime's
    replicas run whole TensorFlow functions (the clients' work), not op by op."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "Using MirroredStrategy eagerly" not in record.getMessage()


logging.getLogger("tensorflow").addFilter(_QuietEagerMirrored())


class DeviceError(ValueError):
    """A device or strategy that this TensorFlow does not have."""


def configure_logical_cpus(count: int) -> list[str]:
    """Splits the host CPU into `count` logical devices (before TensorFlow initializes them).

    This is how the runtime is tested on several replicas without accelerators. Raises
    `DeviceError` if TensorFlow's devices are already initialized with another count."""
    if count < 1:
        raise DeviceError(f"logical CPU count {count}: must be at least 1")
    cpu = tf.config.list_physical_devices("CPU")[0]
    try:
        tf.config.set_logical_device_configuration(
            cpu, [tf.config.LogicalDeviceConfiguration() for _ in range(count)])
    except RuntimeError:
        existing = len(tf.config.list_logical_devices("CPU"))
        if existing != count:
            raise DeviceError(
                f"TensorFlow already initialized {existing} logical CPU device(s); "
                f"{count} must be configured before the first TensorFlow operation") from None
    return [d.name for d in tf.config.list_logical_devices("CPU")]


def _short(name: str) -> str:
    return name.split("device:")[-1]


def build_strategy(devices: str | None = None) -> tf.distribute.Strategy:
    """The strategy for `devices` (see the module docstring). One-line `DeviceError`s for a
    device this TensorFlow lacks or a TPU that cannot be reached."""
    spec = (devices or "").strip()
    if spec.lower().split(":")[0] == "tpu":
        return _tpu_strategy(spec.partition(":")[2])
    available = {_short(d.name).upper(): d.name for d in tf.config.list_logical_devices()}
    if not spec:
        gpus = [name for short, name in available.items() if short.startswith("GPU:")]
        names = gpus or [available["CPU:0"]]
    else:
        names = []
        for item in (s.strip() for s in spec.split(",")):
            key = _short(item).upper()
            if key not in available:
                raise DeviceError(
                    f"device {item!r} does not exist in this TensorFlow (it has "
                    f"{', '.join(sorted(available))}); give devices it lists, e.g. --devices="
                    f"{','.join(sorted(available))}")
            if available[key] in names:
                raise DeviceError(f"device {item!r} is given twice in --devices={spec}")
            names.append(available[key])
    if len(names) == 1:
        return tf.distribute.OneDeviceStrategy(names[0])
    return tf.distribute.MirroredStrategy(
        names, cross_device_ops=tf.distribute.ReductionToOneDevice(reduce_to_device=names[0]))


def _tpu_strategy(address: str) -> tf.distribute.Strategy:
    try:
        resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=address or "")
        tf.config.experimental_connect_to_cluster(resolver)
        tf.tpu.experimental.initialize_tpu_system(resolver)
        return tf.distribute.TPUStrategy(resolver)
    except (ValueError, RuntimeError, tf.errors.OpError) as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DeviceError(f"no TPU reachable as {address or 'the local TPU'!r} "
                          f"(TPUClusterResolver: {first}); run on a TPU VM or give its name "
                          "with --devices=tpu:<name>") from None


def default_clients_in_parallel(devices) -> int:
    """Clients each replica trains at once by default: on CPU-only replicas, the host's cores
    shared among them (what TFF's worker does: one client per core); on accelerators 1.

    >>> default_clients_in_parallel(["/job:localhost/replica:0/task:0/device:GPU:0"])
    1
    """
    if all("CPU" in str(d).upper().split("/")[-1] for d in devices):
        return max(1, (os.cpu_count() or 1) // len(devices))
    return 1


def _replica_runner(strategy: tf.distribute.Strategy) -> Callable[[Callable[[int], None]], None]:
    """`run(fn)` calls fn(r) for every replica r under its device, concurrently."""
    devices = list(strategy.extended.worker_devices)
    if isinstance(strategy, tf.distribute.TPUStrategy):
        # TPUStrategy.run compiles its function with XLA, which cannot hold the clients' dataset
        # loops; each core runs its group under its device scope instead, one thread per core.
        def run_threads(fn):
            errors = []

            def target(r):
                try:
                    with tf.device(devices[r]):
                        fn(r)
                except BaseException as e:  # re-raised in the caller
                    errors.append(e)

            threads = [threading.Thread(target=target, args=(r,)) for r in range(len(devices))]
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            if errors:
                raise errors[0]

        return run_threads

    def run(fn):
        def replica_fn():
            context = tf.distribute.get_replica_context()
            fn(int(tf.get_static_value(context.replica_id_in_sync_group)))

        strategy.run(replica_fn)

    return run


_PIPELINE: compiler_pipeline.CompilerPipeline | None = None


def _shared_pipeline() -> compiler_pipeline.CompilerPipeline:
    """One compiler cache for every `DistributeContext` of the process: a computation is compiled
    once, whichever strategy runs it (each context still imports the graphs onto its devices)."""
    global _PIPELINE
    if _PIPELINE is None:
        _PIPELINE = compiler_pipeline.CompilerPipeline(
            native_compiler.desugar_and_transform_to_native)
    return _PIPELINE


class DistributeContext(context_base.SyncContext):
    """A TFF execution context that runs computations in-process under `strategy`."""

    def __init__(self, strategy: tf.distribute.Strategy, default_num_clients: int = 0,
                 clients_in_parallel: int | None = None):
        self.strategy = strategy
        self.devices = [str(d) for d in strategy.extended.worker_devices]
        if clients_in_parallel is None:
            clients_in_parallel = default_clients_in_parallel(self.devices)
        if int(clients_in_parallel) < 1:
            raise DeviceError(f"clients_in_parallel={clients_in_parallel}: must be >= 1")
        self.clients_in_parallel = int(clients_in_parallel)
        self._run_replicas = _replica_runner(strategy)
        self._default_num_clients = default_num_clients
        self._pipeline = _shared_pipeline()
        self._blocks: dict = {}
        self._interpreters: dict = {}
        self._resident: dict[int, tuple[np.ndarray, tf.Tensor]] = {}
        self.resident_reused = 0  # arguments taken from the device instead of uploaded
        self._lock = threading.Lock()
        self._counted = dict.fromkeys(self.devices, 0)  # clients_per_device when last reported
        self._reported: set[str] = set()

    def invoke(self, comp, arg):
        with self._lock:
            result_type = comp.type_signature.result
            compiled = self._pipeline.compile(comp)
            key = id(compiled)
            if key not in self._blocks:
                self._blocks[key] = (compiled, compiled.to_building_block())
            block = self._blocks[key][1]
            parameter_type = comp.type_signature.parameter
            value = self._ingest(arg, parameter_type) if parameter_type is not None else None
            interpreter = self._interpreter(key, _cardinality(value, parameter_type)
                                            or self._default_num_clients)
            function = interpreter.evaluate(block, {})
            result = interpreter.call(function, value)
            python = self._to_python(result, result_type, interpreter)
            return type_conversions.type_to_py_container(python, result_type)

    @property
    def clients_per_device(self) -> dict[str, int]:
        """How many client computations (`federated_map` members) ran on each device so far."""
        counts = dict.fromkeys(self.devices, 0)
        for interpreter in self._interpreters.values():
            for device, n in zip(self.devices, interpreter.clients_per_replica):
                counts[device] += n
        return counts

    def round_devices(self, kind: str) -> str | None:
        """The line naming the devices client computations ran on since the last call, the first
        time round kind `kind` ran some; None otherwise."""
        counts = self.clients_per_device
        used = [d for d in self.devices if counts[d] > self._counted[d]]
        self._counted = counts
        if not used or kind in self._reported:
            return None
        self._reported.add(kind)
        return f"client steps of round kind {kind!r} ran on {', '.join(used)}"

    def _interpreter(self, key: int, num_clients: int) -> Interpreter:
        interpreter = self._interpreters.get(key)
        if interpreter is None:  # one per computation: its TensorFlow functions are cached
            interpreter = self._interpreters[key] = Interpreter(
                self.devices, self._run_replicas, num_clients, self.clients_in_parallel)
        interpreter.num_clients = num_clients
        return interpreter

    # --- values in and out ------------------------------------------------------------------
    def _ingest(self, value, type_spec: computation_types.Type):
        if isinstance(type_spec, computation_types.FederatedType):
            if type_spec.placement is placements.CLIENTS:
                if type_spec.all_equal and not isinstance(value, (list, tuple)):
                    return ClientValues([self._ingest(value, type_spec.member)])
                return ClientValues([self._ingest(v, type_spec.member) for v in value])
            return self._ingest(value, type_spec.member)
        if isinstance(type_spec, computation_types.StructType):
            if not isinstance(value, structure.Struct):
                value = structure.from_container(value)
            elements = list(structure.iter_elements(type_spec))
            values = list(structure.iter_elements(value))
            if len(values) != len(elements):
                raise TypeError(f"expected {len(elements)} elements for {type_spec}, "
                                f"got {len(values)}")
            named = {name: v for name, v in values if name is not None}
            out = []
            for i, (name, element) in enumerate(elements):
                v = named[name] if name is not None and name in named else values[i][1]
                out.append((name, self._ingest(v, element)))
            return structure.Struct(out)
        if isinstance(type_spec, computation_types.TensorType):
            resident = self._resident.get(id(value))
            if resident is not None and resident[0] is value:
                self.resident_reused += 1
                return resident[1]  # still on the device it was computed on
            return value
        return value  # a sequence: a dataset or a list of elements

    def _to_python(self, value, type_spec: computation_types.Type, interpreter: Interpreter):
        resident: dict = {}

        def convert(v, t):
            if isinstance(t, computation_types.FederatedType):
                if t.placement is placements.CLIENTS:
                    members = v.members if isinstance(v, ClientValues) else [v]
                    if t.all_equal:
                        return convert(members[0], t.member)
                    if len(members) == 1 and interpreter.num_clients > 1:
                        members = members * interpreter.num_clients
                    return [convert(m, t.member) for m in members]
                return convert(v, t.member)
            if isinstance(t, computation_types.StructType):
                return structure.Struct([(name, convert(x, element)) for (name, element), x
                                         in zip(structure.iter_elements(t), v)])
            if tf.is_tensor(v):
                array = v.numpy()
                resident[id(array)] = (array, v)
                return array
            return v

        out = convert(value, type_spec)
        self._resident = resident  # the latest results only: what the next round is fed
        return out


def _cardinality(value, type_spec) -> int:
    """The number of clients in the argument (0 if it places nothing at CLIENTS)."""
    if isinstance(value, ClientValues):
        return len(value) if not (isinstance(type_spec, computation_types.FederatedType)
                                  and type_spec.all_equal) else 0
    if isinstance(value, structure.Struct) and isinstance(type_spec, computation_types.StructType):
        return max([_cardinality(v, t) for v, (_, t)
                    in zip(value, structure.iter_elements(type_spec))] or [0])
    return 0


def report_round_devices(kind: str) -> None:
    """Under a `DistributeContext`, logs its `round_devices(kind)` line (once per round kind) on
    the `tffl.runtime` logger; under any other context, nothing."""
    context = context_stack_impl.context_stack.current
    if isinstance(context, DistributeContext):
        line = context.round_devices(kind)
        if line:
            logging.getLogger("tffl.runtime").info(line)


@contextlib.contextmanager
def distribute_runtime(devices: str | None = None, default_num_clients: int = 0,
                       strategy: tf.distribute.Strategy | None = None,
                       clients_in_parallel: int | None = None) -> Iterator[DistributeContext]:
    """Installs a `DistributeContext` over `strategy` (default: `build_strategy(devices)`) for
    the block: every TFF computation invoked inside runs in this process. `clients_in_parallel`:
    clients per replica at once (default `default_clients_in_parallel`)."""
    context = DistributeContext(strategy or build_strategy(devices), default_num_clients,
                                clients_in_parallel)
    with context_stack_impl.context_stack.install(context):
        yield context
