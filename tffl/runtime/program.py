"""TFF's program layer (`tff.program`, `tff.learning.programs`) on tffl's managed workers.

TFF's program logic (`tff.learning.programs.train_model`, release managers, program state
managers) runs as coroutines and needs the current TFF context to be a
`tff.program.FederatedContext`; TFF builds one as `tff.program.NativeFederatedContext` over an
asynchronous execution context. This module gives

- `program_context(context)`: that `NativeFederatedContext` over any of tffl's synchronous
  contexts (one worker, several, or remote ones), so that the workers' fault handling (a
  `WorkerError` naming a lost worker, the restart of a crashed one) carries over; as a
  simulation's context (`SimulationFederatedContext`) it also runs computations that return
  CLIENTS-placed values (a personalized process's `next`, whose personal states the program
  logic of `tffl.runtime.personalized_program` keeps);
- `ClientDataSource`: a `tff.program.FederatedDataSource` serving seeded per-round client
  datasets (or tensor values, e.g. the linear algorithms' `{x, y}` batches), whose iterator can be deep-copied and saved in the program state (TFF 0.87's
  `DatasetDataSource` iterator cannot be deep-copied, which `train_model` does every round, and it
  samples with the unseeded `random` module, so a resumed run would differ); its iterator also
  names the clients a call chooses (`ClientDataIterator.next_clients`), their positions in the
  population, which key their personal states.

`tffl.runtime.program_runtime()` starts the workers and installs the context for a block.
"""


from __future__ import annotations

import asyncio
import collections
import collections.abc
import json
import weakref
from collections.abc import Callable, Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff

from tffl.runtime.tff_internals import computation_types, context_base, placements, structure


class _BlockingAsyncContext:
    """An asynchronous execution context over a synchronous one (`invoke` is a coroutine).

    The call runs in the awaiting thread, as TFF's own remote executor makes its (blocking) gRPC
    calls inside its coroutines: the event loop waits for each computation. Running it in the
    loop's thread (normally the main thread) keeps a crashed local worker's restart in the
    thread that launched it (`LocalWorker`: the kernel kills a worker when that thread ends).
    """

    def __init__(self, context: context_base.SyncContext):
        self.sync_context = context

    async def invoke(self, comp, arg):
        parameter = comp.type_signature.parameter
        if parameter is not None:
            arg = _clients_first(arg, parameter)
        return self.sync_context.invoke(comp, arg)


def _clients_first(value, value_type):
    """`value` with every `{<n_1=.., ..>}@CLIENTS` part given column-first (a struct of
    per-client lists, as `NativeFederatedContext` materializes it) turned into a list of
    per-client structs, the form a computation is invoked with."""
    if isinstance(value_type, computation_types.StructType):
        elements = structure.to_elements(structure.from_container(value))
        return structure.Struct([
            (name, _clients_first(v, t)) for (name, v), (_, t) in zip(
                elements, structure.iter_elements(value_type))])
    if (isinstance(value_type, computation_types.FederatedType)
            and value_type.placement is placements.CLIENTS and not value_type.all_equal
            and isinstance(value_type.member, computation_types.StructType)
            and not isinstance(value, (list, tuple))):
        columns = structure.to_elements(structure.from_container(value))
        if columns and all(isinstance(c, (list, tuple)) for _, c in columns):
            sizes = {len(c) for _, c in columns}
            if len(sizes) != 1:
                raise ValueError(f"client data {[n for n, _ in columns]} name lists of "
                                 f"different lengths {sorted(sizes)}: one entry per client each")
            return [structure.Struct([(n, c[j]) for n, c in columns])
                    for j in range(sizes.pop())]
    return value


class SimulationFederatedContext(tff.program.NativeFederatedContext):
    """TFF's `NativeFederatedContext` over a synchronous context, for a simulation.

    TFF's context refuses a computation whose result holds CLIENTS-placed values: on a deployed
    platform those stay on the devices. A simulation holds them: a personalized process's
    `next: (S@SERVER, D@CLIENTS, P@CLIENTS) -> <S@SERVER, P@CLIENTS, metrics@SERVER>` returns the
    clients' new personal states, which the program keeps for their next rounds. This context
    runs such a computation too: its whole result is one `tff.program.NativeValueReference`,
    which materializes to the computation's value (CLIENTS-placed parts as lists in client
    order); its CLIENTS-placed arguments are given one entry per client (or column-first, as
    `ClientDataIterator.select` serves data). Every other computation runs exactly as in TFF's
    context (value references per tensor), so TFF's own program logic runs unchanged.
    """

    def __init__(self, context: context_base.SyncContext):
        self._blocking_context = _BlockingAsyncContext(context)
        super().__init__(self._blocking_context)

    def invoke(self, comp, arg):
        result_type = comp.type_signature.result
        if tff.program.contains_only_server_placed_data(result_type):
            return super().invoke(comp, arg)

        async def run():
            value = await tff.program.materialize_value(arg)
            return await self._blocking_context.invoke(comp, value)

        return tff.program.NativeValueReference(asyncio.create_task(run()), result_type)


def program_context(context: context_base.SyncContext) -> SimulationFederatedContext:
    """TFF's `NativeFederatedContext` running its computations on `context` (e.g. the one
    `local_runtime()` or `remote_runtime()` yields), as a `SimulationFederatedContext`.

    Invoked computations return `tff.program.MaterializableValueReference`s, as in any TFF
    program; awaiting one (`tff.program.materialize_value`) runs the computation. Install it with
    `runtime.installed(...)`, or use `runtime.program_runtime()`, which does both.

    >>> with runtime.remote_runtime(["hostA:8000"]) as context:  # doctest: +SKIP
    ...     with runtime.installed(program_context(context)):
    ...         asyncio.run(tff.learning.programs.train_model(...))
    """
    return SimulationFederatedContext(context)


# Live sources by name: a saved iterator records its source's name and finds it again on load.
_SOURCES: "weakref.WeakValueDictionary[str, ClientDataSource]" = weakref.WeakValueDictionary()


class ClientDataSource(tff.program.FederatedDataSource):
    """Client datasets for TFF programs: each round a seeded choice of clients.

    `client_datasets` is the population: a sequence of `tf.data.Dataset`s (the same clients every
    round), or a function of the round number (1, 2, ...) returning that round's sequence (fresh
    data per round, e.g. seeded by the round). A client may also be a mapping of arrays (one
    tensor value per client, e.g. the linear algorithms' `OrderedDict(x=(m_i, d), y=(m_i,))`):
    `federated_type` is then that structure with the leading dimension None, and a round's
    choice is served column-first (`ClientDataIterator.select`; without `data_names`). Round r selects `k` of them without replacement
    with `numpy.random.default_rng([seed, r])`, in population order; `k=None` or `k` equal to the
    population size selects all. The selection depends only on (seed, r), so a run resumed from
    a program state gets the clients the uninterrupted run got.

    The iterator's saved form (`to_bytes`) holds the source's `name`, seed and the number of
    rounds served, not the data: to resume, build the source again with the same name and seed
    before `train_model` loads the program state (`from_bytes` raises `LookupError` otherwise).
    Building a source with the name of a live one replaces it.

    >>> datasets = [tf.data.Dataset.range(n) for n in (10, 20, 30)]  # 3 clients
    >>> source = ClientDataSource("doc", datasets, seed=1)
    >>> iterator = source.iterator()
    >>> [int(d.cardinality()) for d in iterator.select(2)]   # round 1: 2 of the 3 clients
    [10, 20]
    >>> ClientDataIterator.from_bytes(iterator.to_bytes()).rounds_served
    1
    """

    def __init__(
        self,
        name: str,
        client_datasets: Sequence[tf.data.Dataset] | Callable[[int], Sequence[tf.data.Dataset]],
        seed: int = 0,
        data_names: Sequence[str] | None = None,
    ):
        if not callable(client_datasets) and not client_datasets:
            raise ValueError("ClientDataSource needs at least one client dataset")
        if data_names is not None and (not data_names or len(set(data_names)) != len(data_names)):
            raise ValueError(f"data_names={list(data_names)} must be distinct names, one per "
                             "communication round of a process's `next`")
        self.name = name
        self.seed = int(seed)
        self.data_names = tuple(data_names) if data_names is not None else None
        self._client_datasets = client_datasets
        self._federated_type = None
        _SOURCES[name] = self

    def population(self, round_num: int) -> Sequence[tf.data.Dataset]:
        """The clients' datasets to choose from in round `round_num` (from 1)."""
        if callable(self._client_datasets):
            return list(self._client_datasets(round_num))
        return list(self._client_datasets)

    @property
    def federated_type(self) -> tff.FederatedType:
        """`{sequence of the datasets' elements}@CLIENTS`, or `{tensors}@CLIENTS` for clients
        given as arrays (read off round 1's first client)."""
        if self._federated_type is None:
            first = self.population(1)[0]
            if isinstance(first, tf.data.Dataset):
                member = tff.SequenceType(
                    computation_types.tensorflow_to_type(first.element_spec))
            else:
                member = computation_types.tensorflow_to_type(tf.nest.map_structure(
                    lambda v: tf.TensorSpec([None, *np.shape(v)[1:]], np.asarray(v).dtype),
                    first))
            if self.data_names is not None:
                member = tff.StructType([(n, member) for n in self.data_names])
            self._federated_type = tff.FederatedType(member, tff.CLIENTS)
        return self._federated_type

    def iterator(self) -> ClientDataIterator:
        return ClientDataIterator(self, rounds_served=0)


class ClientDataIterator(tff.program.FederatedDataSourceIterator):
    """The position of a pass over a `ClientDataSource`: how many rounds it has served.

    Deep copies share the source (datasets are not copied) and keep the position, as
    `train_model` needs to retry a discarded round and to save the iterator.
    """

    def __init__(self, source: ClientDataSource, rounds_served: int = 0):
        self.source = source
        self.rounds_served = rounds_served

    @property
    def federated_type(self) -> tff.FederatedType:
        return self.source.federated_type

    def select(self, k: int | None = None):
        """The next call's `k` clients' datasets (all with `k=None`): a list of datasets, or,
        with `data_names` (E names), `OrderedDict(name_e=[k datasets])` for communication rounds
        E·(c−1)+e of call c, each its own seeded choice. (A `{<...>}@CLIENTS` value in this
        column-first form: `program_context` hands it to the computation one struct per
        client, since TFF 0.87's program layer mispairs a list of per-client structs.) Clients
        given as mappings of arrays come in that form too: `OrderedDict(x=[k arrays], ...)`."""
        calls = self.rounds_served + 1
        names = self.source.data_names
        if names is None:
            chosen = self._choose(calls, k)
            if chosen and isinstance(chosen[0], collections.abc.Mapping):
                chosen = collections.OrderedDict((n, [c[n] for c in chosen]) for n in chosen[0])
        else:
            first = len(names) * (calls - 1) + 1
            chosen = collections.OrderedDict(
                (n, self._choose(first + e, k)) for e, n in enumerate(names))
        self.rounds_served = calls
        return chosen

    def next_clients(self, k: int | None = None):
        """The clients the next `select(k)` serves, without serving them: their positions in the
        population (in population order), a list of ints, or, with `data_names`,
        `OrderedDict(name_e=[positions])`. A position is the client's identity across rounds
        (round r's data of client i is `population(r)[i]`), e.g. the key of its personal state.

        >>> source = ClientDataSource("ids", [tf.data.Dataset.range(n) for n in (10, 20, 30)],
        ...                           seed=1)
        >>> iterator = source.iterator()
        >>> iterator.next_clients(2)                  # round 1 will serve clients 0 and 1 ...
        [0, 1]
        >>> [int(d.cardinality()) for d in iterator.select(2)]     # ... of 10 and 20 examples
        [10, 20]
        """
        calls = self.rounds_served + 1
        names = self.source.data_names

        def indices(round_num: int) -> list[int]:
            return self._indices(round_num, k, len(self.source.population(round_num)))

        if names is None:
            return indices(calls)
        first = len(names) * (calls - 1) + 1
        return collections.OrderedDict((n, indices(first + e)) for e, n in enumerate(names))

    def _indices(self, round_num: int, k: int | None, size: int) -> list[int]:
        if k is None:
            k = size
        if not 0 < k <= size:
            raise ValueError(f"k={k} clients requested from a population of {size}")
        if k == size:
            return list(range(k))
        rng = np.random.default_rng([self.source.seed, round_num])
        return [int(i) for i in sorted(rng.choice(size, size=k, replace=False))]

    def _choose(self, round_num: int, k: int | None) -> list[tf.data.Dataset]:
        population = self.source.population(round_num)
        return [population[i] for i in self._indices(round_num, k, len(population))]

    def to_bytes(self) -> bytes:
        return json.dumps({"source": self.source.name, "seed": self.source.seed,
                           "rounds_served": self.rounds_served}).encode()

    @classmethod
    def from_bytes(cls, buffer: bytes) -> ClientDataIterator:
        saved = json.loads(bytes(buffer).decode())
        source = _SOURCES.get(saved["source"])
        if source is None:
            raise LookupError(f"no ClientDataSource named {saved['source']!r} exists: build it "
                              "(same name and seed) before loading the program state")
        if source.seed != saved["seed"]:
            raise ValueError(f"ClientDataSource {source.name!r} has seed {source.seed}, the saved "
                             f"iterator seed {saved['seed']}: the resumed run would differ")
        return cls(source, saved["rounds_served"])

    def __deepcopy__(self, memo) -> ClientDataIterator:
        return ClientDataIterator(self.source, self.rounds_served)

    def __eq__(self, other: object) -> bool:
        if not isinstance(other, ClientDataIterator):
            return NotImplemented
        return (self.source, self.rounds_served) == (other.source, other.rounds_served)

    __hash__ = None
