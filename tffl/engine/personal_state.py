"""Stateful clients: the declared personal state (`PersonalSpec`), the protocol of a process
whose clients keep one, and the per-client state store.

TFF clients are stateless: a client computation sees only what the round passes in. Personalized
algorithms (FedRep's heads, LG-FedAvg's local layers, AdaptPFL's shortcuts, FLUTE's heads) keep
*personal variables* that never leave the client. Every process declares its clients' personal
state as a `PersonalSpec` (the names, shapes and dtypes of one client's tensors and its initial
value per client id); an algorithm without one declares `NO_PERSONAL_STATE`, the empty spec, so
the engine's composer, cycle, client computations and process builder have one form for both.
A process with a non-empty spec takes and returns the personal state as a CLIENTS-placed value:

    next: (state@SERVER, data@CLIENTS, personal@CLIENTS)
          -> PersonalizedOutput(state@SERVER, personal@CLIENTS, metrics@SERVER)

This is a `tff.templates.IterativeProcess`, not a `tff.learning.templates.LearningProcess`: its
`next` has a third argument and a third result, which TFF's `LearningProcess` constructor refuses
(`tffl.engine.process`). In simulation the CLIENTS-placed values are Python lists, one entry per
participating client, in the order of `data`. The driver (`tffl.simulation.driver.run_rounds`)
keeps a `PersonalStore` keyed by client id: before a round it looks up the sampled clients'
entries (a client seen for the first time gets `process.initialize_personal(client_id)`), after
the round it writes back what `next` returned; clients that did not take part keep theirs
unchanged. The store is saved with every checkpoint and restored on resume.

Inside a TFF program (the current context a `tff.program.FederatedContext`), TFF's own program
logic (`tff.learning.programs.train_model`) would call `initialize` and then `next` with two
arguments, dropping the personal states. A personalized process's `initialize` therefore
refuses to run in a program context (`check_program_carries_personal_states`) unless the
program logic carries the personal states (`carried_by_program()`, which
`tffl.runtime.personalized_program.train_personalized_model` enters): TFF's `train_model` stops
with one line naming that program logic, before it saves any program state.

Example:

>>> from tffl.algorithms import personalized                  # FedRep: the head is the personal state
>>> process = personalized.build_personalized_process("fedrep", model_fn, input_spec, 0.05)
>>> store = PersonalStore(process.initialize_personal)
>>> with runtime.local_runtime():
...     state = process.initialize()
...     output = process.next(state, datasets, store.lookup(client_ids))
>>> store.update(client_ids, output.personal_states)
>>> store.client_ids(), len(store), process.personal.names
(['a', 'b'], 2, ('head/kernel:0', 'head/bias:0'))
>>> bool(NO_PERSONAL_STATE), str(NO_PERSONAL_STATE.type)          # an algorithm without one
(False, '<>')
"""

from __future__ import annotations

import collections
import contextlib
import contextvars
import dataclasses
from collections.abc import Callable, Iterator, Sequence
from typing import Any, NamedTuple

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


@dataclasses.dataclass(frozen=True)
class PersonalSpec:
    """One client's personal state, declared: tensor `names`, their `shapes` and `dtypes`, and
    `initial(client_id)`, a client's state before it first trains. `keyed`: the value is an
    `OrderedDict(name=array)` (else a list in `names`' order). A spec is true when it declares
    a tensor; the empty one (`NO_PERSONAL_STATE`) is an algorithm without personal state."""

    names: tuple[str, ...]
    shapes: tuple[tuple[int, ...], ...]
    dtypes: tuple[Any, ...]
    initial: Callable[[str], Any]
    keyed: bool = False

    def __bool__(self) -> bool:
        return bool(self.names)

    @property
    def type(self) -> tff.Type:
        """The TFF type of one client's personal state (`P` of `next`; `<>` when empty)."""
        tensors = [tff.TensorType(d, s) for d, s in zip(self.dtypes, self.shapes)]
        if self.keyed:
            return tff.StructWithPythonType(list(zip(self.names, tensors)),
                                            collections.OrderedDict)
        return tff.types.to_type(tensors)

    def values(self, personal) -> list:
        """The tensors of one personal state, in `names`' order."""
        return [personal[n] for n in self.names] if self.keyed else list(personal)

    def initialize(self, client_id: str) -> Any:
        """Client `client_id`'s initial personal state (checked against the declaration)."""
        personal = self.initial(client_id)
        self.check([personal], what=f"initial personal state of client {client_id!r}")
        return personal

    def check(self, personal_states: Sequence[Any], count: int | None = None,
              what: str = "personal state") -> None:
        """ValueError naming the client and tensor unless there are `count` states (when given),
        each with this declaration's tensors and shapes."""
        personal_states = list(personal_states)
        if count is not None and len(personal_states) != count:
            raise ValueError(f"{count} client datasets but {len(personal_states)} personal "
                             "states: pass one personal state per client, in order")
        for i, personal in enumerate(personal_states):
            try:
                values = self.values(personal)
            except (KeyError, TypeError) as e:
                raise ValueError(f"{what} {i}: expected tensors {list(self.names)}, got "
                                 f"{type(personal).__name__} ({e})") from None
            if len(values) != len(self.names):
                raise ValueError(f"{what} {i} has {len(values)} tensors; this process's has "
                                 f"{len(self.names)} ({', '.join(self.names)})")
            for name, shape, value in zip(self.names, self.shapes, values):
                if tuple(np.shape(value)) != tuple(shape):
                    raise ValueError(f"{what} {i}: {name} must have shape {tuple(shape)}, got "
                                     f"{tuple(np.shape(value))}")


def _no_personal_state(client_id: str) -> list:
    del client_id
    return []


# The personal state of an algorithm whose clients keep none.
NO_PERSONAL_STATE = PersonalSpec(names=(), shapes=(), dtypes=(), initial=_no_personal_state)


# True while a program logic that carries the clients' personal states runs (`carried_by_program`).
_CARRIED_BY_PROGRAM = contextvars.ContextVar("personal_states_carried_by_program", default=False)


@contextlib.contextmanager
def carried_by_program() -> Iterator[None]:
    """Marks the block (a program logic's coroutine, or code it calls) as carrying every
    client's personal state from round to round, so that a personalized process's `initialize`
    runs in the TFF program context there (`check_program_carries_personal_states`)."""
    token = _CARRIED_BY_PROGRAM.set(True)
    try:
        yield
    finally:
        _CARRIED_BY_PROGRAM.reset(token)


def check_program_carries_personal_states(algorithm: str) -> None:
    """TypeError if the current TFF context is a program's (`tff.program.FederatedContext`) and
    the caller is not inside `carried_by_program()`: TFF's own program logic would drop the
    personal states of `algorithm`'s clients.

    >>> check_program_carries_personal_states("fedrep")   # TFF's default context: no program
    """
    in_program = isinstance(tff.framework.get_context_stack().current,
                            tff.program.FederatedContext)
    if in_program and not _CARRIED_BY_PROGRAM.get():
        raise TypeError(
            f"{algorithm} keeps a personal state per client, which TFF's program logic "
            "(tff.learning.programs.train_model) cannot carry: run it with "
            "tffl.runtime.personalized_program.train_personalized_model")


class PersonalizedOutput(NamedTuple):
    """What a personalized process's `next` returns.

    Attributes:
      state: the new server state (SERVER-placed).
      personal_states: the participating clients' new personal states (CLIENTS-placed: a list in
        the order of the round's client data).
      metrics: the round's metrics (SERVER-placed).
    """

    state: Any
    personal_states: Any
    metrics: Any


def _as_numpy(structure: Any) -> Any:
    return tf.nest.map_structure(
        lambda v: np.array(v.numpy() if hasattr(v, "numpy") else v), structure
    )


class PersonalStore:
    """Personal states keyed by client id; missing clients start at `initial_fn(client_id)`.

    Values are stored as numpy structures (copies), so later mutation of what a process returned
    cannot change the store.
    """

    def __init__(self, initial_fn: Callable[[str], Any]):
        self._initial_fn = initial_fn
        self._states: dict[str, Any] = {}

    def __len__(self) -> int:
        return len(self._states)

    def __contains__(self, client_id: str) -> bool:
        return client_id in self._states

    def client_ids(self) -> list[str]:
        """The ids with a stored state, sorted."""
        return sorted(self._states)

    def get(self, client_id: str) -> Any:
        """Client `client_id`'s state (its initial state if it never took part)."""
        if client_id not in self._states:
            return _as_numpy(self._initial_fn(client_id))
        return self._states[client_id]

    def lookup(self, client_ids: Sequence[str]) -> list[Any]:
        """The states of `client_ids`, in order (the CLIENTS-placed argument of `next`)."""
        return [self.get(cid) for cid in client_ids]

    def update(self, client_ids: Sequence[str], personal_states: Sequence[Any]) -> None:
        """Stores the states `next` returned for `client_ids` (same order and length)."""
        personal_states = list(personal_states)
        if len(personal_states) != len(client_ids):
            raise ValueError(f"{len(client_ids)} clients took part but the process returned "
                             f"{len(personal_states)} personal states")
        for cid, value in zip(client_ids, personal_states):
            self._states[cid] = _as_numpy(value)

    # Checkpointing: flat named arrays for `tffl.simulation.checkpoint.save(..., extra=...)`.

    def to_arrays(self) -> dict[str, np.ndarray]:
        """`{"<client id>/<k>": leaf k of its state}` for every stored client."""
        arrays = {}
        for cid in self.client_ids():
            for k, leaf in enumerate(tf.nest.flatten(self._states[cid])):
                arrays[f"{cid}/{k:04d}"] = np.asarray(leaf)
        return arrays

    def load_arrays(self, arrays: dict[str, np.ndarray]) -> None:
        """Replaces the store by the one `to_arrays` wrote, structured like `initial_fn`'s states.

        Raises:
          ValueError: a client's leaves do not match the initial state's count or shapes.
        """
        by_client: dict[str, dict[int, np.ndarray]] = {}
        for key, value in arrays.items():
            cid, _, k = key.rpartition("/")
            by_client.setdefault(cid, {})[int(k)] = np.asarray(value)
        states = {}
        for cid, leaves in by_client.items():
            template = _as_numpy(self._initial_fn(cid))
            flat = tf.nest.flatten(template)
            if sorted(leaves) != list(range(len(flat))):
                raise ValueError(f"personal state of client {cid!r} in the checkpoint has "
                                 f"{len(leaves)} leaves, the process's has {len(flat)}")
            for k, t in enumerate(flat):
                if leaves[k].shape != np.shape(t):
                    raise ValueError(
                        f"personal state of client {cid!r}, leaf {k}: checkpoint shape "
                        f"{leaves[k].shape}, process shape {np.shape(t)}")
            states[cid] = tf.nest.pack_sequence_as(template, [leaves[k] for k in range(len(flat))])
        self._states = states
