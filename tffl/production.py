"""Our federated computations in TFF's production forms, and as bytes to embed elsewhere.

TFF's production backends do not run an arbitrary federated computation: they run one
round in one of two *forms* from `tff.backends.mapreduce` (TFF 0.87), both of the signature

    round: (server_state@SERVER, client_data@CLIENTS) -> (server_state@SERVER, output@SERVER)

- `MapReduceForm`: plain TensorFlow pieces `prepare` (server state -> what is broadcast),
  `work` (one client: (client data, broadcast) -> what it feeds into the aggregations),
  `zero`/`accumulate`/`merge`/`report` (one aggregation over all clients), the secure-sum
  parameters, and `update` ((server state, aggregate) -> (new server state, output)).
- `DistributeAggregateForm`: TFF lambdas `server_prepare`, `server_to_client_broadcast`,
  `client_work`, `client_to_server_aggregation`, `server_result`, with the same data flow.

In both, a round is exactly one broadcast followed by one aggregation, and the only
CLIENTS-placed values are the client data that goes in and what a client hands to the
aggregations; nothing placed at CLIENTS comes out of a round.

Which of our algorithms take which form (checked by `tests/tffl/test_production.py`):

| algorithm (`tffl.algorithms.lora_fl`)            | MapReduceForm                   | DistributeAggregateForm |
|---------------------------------------|---------------------------------|-------------------------|
| `fedavg_lora`, `ffa_lora`             | `next` (its one round kind)     | the same                |
| `rolora`                              | `b_round`, `a_round`            | the same                |
| `rolora_ffa`                          | `next` (its one switch round)   | the same                |
| `flexlora`, `flora`                   | `next` (its one round kind)     | no (TFF 0.87, below)    |

- RoLoRA has two round kinds of one state type; its `next` is their cycle (B round, then A
  round), which no form holds: a computation that chains two broadcast-aggregate rounds is
  refused by TFF ("Detected broadcast dependent on aggregate"; `_reason` says so). Deploy
  `process.rounds["b_round"]` and `["a_round"]` and call them alternately (what
  `to_map_reduce_form(process)` compiles). RoLoRA→FFA is one switch round kind
  (`tffl.engine.switch_round`), so its `next` compiles as it is.
- FlexLoRA and FLoRA aggregate with `tff.federated_aggregate` (the stacking accumulator of
  their uploaded factors; so does FedAvg-LoRA with `averaging_error=True`). TFF 0.87's
  DistributeAggregateForm compiler wraps every non-placed argument of an aggregation intrinsic in
  a SERVER-placed value, which fails for the accumulate/merge/report *functions* ("Expected a
  `tff.FederatedType` to not contain `tff.FederatedType`s or `tff.FunctionType`s"). Its
  MapReduceForm is fine.

Personalized algorithms with personal state (`tffl.algorithms.personalized`: `fedrep`, `fedper`,
`lg_fedavg`, `flute`, `adaptpfl`) take neither form. Their rounds are

    (state@SERVER, data@CLIENTS, personal@CLIENTS)
        -> (state@SERVER, personal@CLIENTS, metrics@SERVER)

and each client's new personal variables h_i (its head, LG-FedAvg's local layers, AdaptPFL's
shortcut, FLUTE's head and class indicator) must come back *to that client*. In MapReduceForm the
result of `work` feeds only `accumulate` (and the secure sums), and `update` produces only
SERVER-placed values; in DistributeAggregateForm the result of `client_work` is the argument of
`client_to_server_aggregation`, which may contain only aggregation intrinsics, and `server_result`
may contain only SERVER placements. So a CLIENTS-placed result has no place in either form (the
personal state could be packed into the client data as an *input*, but not returned), short of
sending h_i to the server, which would defeat its purpose. `to_map_reduce_form` and
`to_distribute_aggregate_form` reject such computations up front with a `ValueError` that says
so. (Their `fedavg` and `fedavg_ft`, which keep no personal state, compile.) Run personalized
processes with `tffl.simulation.driver` and its `PersonalStore`; their computations still serialize.

Serialization: `serialize` / `deserialize` turn any `tff.Computation` (a federated computation, a
TF computation, a form's piece) into `bytes` of a `computation.proto` and back. The deserialized
computation has the same type signature and runs in any TFF execution context, but Python
containers are lost: structures come back as `OrderedDict`s (named fields) and tuples, e.g.
a round returns `OrderedDict(state=..., metrics=...)` instead of a `LearningProcessOutput`.
`save_process` writes a `tffl.engine.process.Process`'s computations (`initialize`, its
`rounds`, the weights' getter and setter) and a manifest (its schedule's cycle, its declared
personal state) as files; `load_process` rebuilds the `Process` from them, containers restored.

Example:

>>> forms = to_map_reduce_form(process)            # {round kind: MapReduceForm}
>>> sorted(forms)
['a_round', 'b_round']
>>> _ = save_process(process, run_dir / "rolora")
>>> saved = load_process(run_dir / "rolora")       # a Process again, without the model code
>>> with runtime.local_runtime():
...     state = saved.initialize()
...     output = saved.rounds["b_round"](state, client_datasets)
...     state = saved.next_round(output.state, client_datasets).state     # the A round
>>> isinstance(saved, tff.learning.templates.LearningProcess), saved.round_name(state)
(True, 'b_round')
"""

from __future__ import annotations

import collections
import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2

from tffl.engine import schedules
from tffl.engine.personal_state import PersonalizedOutput, PersonalSpec
from tffl.engine.process import Process, ProcessParts

_MANIFEST = "manifest.json"
_BROADCAST_AFTER_AGGREGATE = "broadcast dependent on aggregate"


def to_map_reduce_form(process_or_computation, name: str | None = None):
    """TFF's `MapReduceForm` of a round, or of each communication round of a process.

    Args:
      process_or_computation: a federated computation `(state@S, data@C) -> (state@S, out@S)`
        (e.g. `process.rounds["b_round"]`), or a `tffl.engine.process.Process`, whose round
        kinds (`rounds`) are compiled one by one.
      name: what error messages call it (default: the process's `algorithm`, else "computation").

    Returns:
      A `tff.backends.mapreduce.MapReduceForm` for a computation; for a process, an
      `OrderedDict` {round kind: `MapReduceForm`} in the order the process runs its rounds.

    Raises:
      ValueError: naming the algorithm and the reason, if the computation does not have the
        signature of one round (e.g. a personalized round, whose clients keep personal state) or
        TFF cannot compile it.
      TypeError: neither a `tff.Computation` nor a `Process`.
    """
    return _compile(process_or_computation, name, "MapReduceForm",
                    tff.backends.mapreduce.get_map_reduce_form_for_computation)


def to_distribute_aggregate_form(process_or_computation, name: str | None = None):
    """TFF's `DistributeAggregateForm` of a round, or of each communication round of a process.

    Arguments and result as `to_map_reduce_form`, with `DistributeAggregateForm` for
    `MapReduceForm`.

    Raises:
      ValueError: as `to_map_reduce_form`; also for a round that uses `tff.federated_aggregate`
        (FlexLoRA, FLoRA), which TFF 0.87 cannot put in this form.
    """
    return _compile(process_or_computation, name, "DistributeAggregateForm",
                    tff.backends.mapreduce.get_distribute_aggregate_form_for_computation)


def serialize(computation: tff.Computation) -> bytes:
    """The `computation.proto` bytes of `computation` (`tff.framework.serialize_computation`).

    Raises:
      TypeError: `computation` is not a `tff.Computation` (e.g. a Python wrapper around one).
      NotImplementedError: TFF cannot serialize that kind of computation.
    """
    return tff.framework.serialize_computation(computation).SerializeToString()


def deserialize(data: bytes) -> tff.Computation:
    """The computation `serialize` turned into `data` (`tff.framework.deserialize_computation`):
    same type signature, runs in the current TFF context; results come back as `OrderedDict`s and
    tuples rather than the original Python containers."""
    return tff.framework.deserialize_computation(computation_pb2.Computation.FromString(data))


_SCHEDULE_RECORD = 8  # communication rounds of the schedule written to the manifest
_WEIGHTS_FILES = {"get_model_weights": "get_model_weights.pb",
                  "set_model_weights": "set_model_weights.pb"}


def save_process(process: Process, directory) -> pathlib.Path:
    """Writes `process`'s computations to `directory` (created if needed) and returns it.

    Files: `initialize.pb`, one `round_<k>.pb` per round kind (`process.rounds`), `next.pb`
    when there are several kinds (the composed cycle, for a deployment that runs it as one
    computation), `get_model_weights.pb`, `set_model_weights.pb` and `manifest.json`
    (algorithm, round kinds and files, the schedule's `cycle`, `shared_cycle_data`, its first
    round kinds for the record, and the declared personal state of a personalized process).
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    round_files = [(name, f"round_{k}.pb") for k, name in enumerate(process.rounds)]
    files = {"initialize.pb": process.initialize,
             _WEIGHTS_FILES["get_model_weights"]: process.get_model_weights,
             _WEIGHTS_FILES["set_model_weights"]: process.set_model_weights}
    files.update((filename, process.rounds[name]) for name, filename in round_files)
    several = len(process.rounds) > 1
    if several:
        files["next.pb"] = process.next
    for filename, computation in files.items():
        (directory / filename).write_bytes(serialize(computation))
    personal = process.personal
    manifest = {
        "algorithm": process.algorithm,
        "initialize": "initialize.pb",
        "rounds": round_files,
        "next": "next.pb" if several else None,
        **_WEIGHTS_FILES,
        "cycle": None if process.cycle is None else list(process.cycle),
        "shared_cycle_data": process.shared_cycle_data,
        "schedule": [process.schedule(t) for t in range(_SCHEDULE_RECORD)],
        "personalized": personal is not None,
        "personal": None if personal is None else {
            "names": list(personal.names),
            "shapes": [list(s) for s in personal.shapes],
            "dtypes": [tf.as_dtype(d).name for d in personal.dtypes],
            "keyed": personal.keyed},
    }
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return directory


def load_process(directory, initial_personal: Callable[[str], Any] | None = None) -> Process:
    """The `Process` `save_process` wrote to `directory`, rebuilt from its deserialized
    computations (results re-annotated with their containers, `_annotated`), its schedule from
    the saved cycle; no model (`model` None: no frozen-weights check, `model_weights` is
    `get_model_weights`). The frozen weights the rounds read stay in their file (a path in the
    graph).

    Args:
      directory: what `save_process` wrote.
      initial_personal: for a personalized process, `client id -> that client's initial
        personal state` (the declaration's tensors); the saved files do not hold it.

    Raises:
      FileNotFoundError: `directory` has no `manifest.json` or a listed file is missing.
      ValueError: a personalized process without `initial_personal`.
    """
    directory = pathlib.Path(directory)
    manifest = json.loads((directory / _MANIFEST).read_text())
    personal = _personal_spec(manifest, initial_personal)

    def load(filename: str) -> tff.Computation:
        return _annotated(deserialize((directory / filename).read_bytes()))

    rounds = collections.OrderedDict(
        (name, load(filename)) for name, filename in manifest["rounds"])
    return Process.of(ProcessParts(
        manifest["algorithm"], load(manifest["initialize"]), rounds,
        get_model_weights=load(manifest["get_model_weights"]),
        set_model_weights=load(manifest["set_model_weights"]),
        schedule=_schedule(manifest["cycle"]), personal=personal,
        shared_cycle_data=manifest.get("shared_cycle_data", False)))


def _personal_spec(manifest: Mapping[str, Any], initial_personal) -> PersonalSpec | None:
    if not manifest["personalized"]:
        return None
    if initial_personal is None:
        raise ValueError(f"{manifest['algorithm']} is personalized: pass initial_personal= "
                         "(a function client id -> that client's initial personal state)")
    declared = manifest["personal"]
    return PersonalSpec(
        names=tuple(declared["names"]), shapes=tuple(tuple(s) for s in declared["shapes"]),
        dtypes=tuple(np.dtype(tf.as_dtype(d).as_numpy_dtype) for d in declared["dtypes"]),
        initial=initial_personal, keyed=declared["keyed"])


def _schedule(cycle: list[str] | None):
    """The periodic schedule of a saved `cycle` (None: the process's one kind)."""
    if not cycle:
        return None
    if len(cycle) == 1:
        return schedules.constant(cycle[0])
    if len(cycle) == 2:
        return schedules.alternating(*cycle)
    return schedules.cyclic(cycle)


# Containers a deserialized computation's structures get back, by their field names.
_CONTAINERS = {
    container._fields: container
    for container in (tff.learning.templates.LearningProcessOutput, PersonalizedOutput,
                      tff.learning.templates.LearningAlgorithmState,
                      tff.learning.models.ModelWeights)}


def _with_containers(type_spec: tff.Type) -> tff.Type:
    """`type_spec` with TFF's process containers (`_CONTAINERS`: a round's output, the
    algorithm state, model weights) on the structures with their field names."""
    if isinstance(type_spec, tff.FederatedType):
        return tff.FederatedType(_with_containers(type_spec.member), type_spec.placement,
                                 type_spec.all_equal)
    if not isinstance(type_spec, tff.StructType):
        return type_spec
    elements = [(name, _with_containers(t))
                for name, t in tff.structure.iter_elements(type_spec)]
    container = _CONTAINERS.get(tuple(name for name, _ in elements))
    if container is None:
        return tff.StructType(elements)
    return tff.StructWithPythonType(elements, container)


def _annotated(computation: tff.Computation) -> tff.Computation:
    """A deserialized computation whose parameter and result carry the containers the original
    had (`_with_containers`): a round returns a `LearningProcessOutput` (a personalized one a
    `PersonalizedOutput`), as TFF's `LearningProcess` and `Process.next_round` require."""
    signature = computation.type_signature
    parameter = (None if signature.parameter is None
                 else _with_containers(signature.parameter))
    return tff.framework.ConcreteComputation.with_type(
        computation, tff.FunctionType(parameter, _with_containers(signature.result)))


def _compile(target, name: str | None, form_name: str, compiler: Callable[[Any], Any]):
    """`compiler` applied to a computation, or to each communication round of a process."""
    if isinstance(target, tff.Computation):
        return _compile_round(target, name or "computation", form_name, compiler)
    if not isinstance(target, Process):
        raise TypeError(f"expected a tff.Computation or a tffl.engine.process.Process, got "
                        f"{type(target).__name__}")
    name = name or target.algorithm
    return collections.OrderedDict(
        (round_name, _compile_round(comp, f"{name} ({round_name})", form_name, compiler))
        for round_name, comp in target.rounds.items())


def _compile_round(computation: tff.Computation, name: str, form_name: str,
                   compiler: Callable[[Any], Any]):
    _check_round_signature(computation, name, form_name)
    try:
        return compiler(computation)
    except Exception as error:  # TFF raises several internal error types here.
        raise ValueError(f"{name}: TFF {tff.__version__} cannot compile it to {form_name}: "
                         f"{_reason(computation, error, form_name)}"
                         f"[{type(error).__name__}: {_first_line(error)}]") from error


def _check_round_signature(computation: tff.Computation, name: str, form_name: str) -> None:
    """Raises a `ValueError` unless `computation` is (X@SERVER, Y@CLIENTS) -> (X'@S, Z@S)."""
    signature = computation.type_signature
    parameter, result = signature.parameter, signature.result
    results = list(result) if isinstance(result, tff.StructType) else [result]
    clients_results = [k for k, t in enumerate(results) if _placed_at(t, tff.CLIENTS)]
    if clients_results:
        raise ValueError(
            f"{name}: result element(s) {clients_results} of this computation are placed at "
            "CLIENTS (the personal state clients keep between rounds, e.g. a personal head), and "
            f"{form_name} has no place for them. A round in MapReduceForm or "
            "DistributeAggregateForm is (server_state@SERVER, client_data@CLIENTS) -> "
            "(server_state@SERVER, output@SERVER): what a client computes leaves it only as input "
            "to the aggregations. "
            "Run personalized processes with tffl.simulation.driver and a PersonalStore. "
            f"Type signature: {signature}")
    shape_ok = (
        isinstance(parameter, tff.StructType) and len(parameter) == 2
        and _placed_at(parameter[0], tff.SERVER) and _placed_at(parameter[1], tff.CLIENTS)
        and isinstance(result, tff.StructType) and len(result) == 2
        and all(_placed_at(t, tff.SERVER) for t in result)
    )
    if not shape_ok:
        raise ValueError(
            f"{name}: {form_name} needs one round (server_state@SERVER, client_data@CLIENTS) -> "
            f"(server_state@SERVER, output@SERVER); this computation is {signature}")


def _placed_at(type_spec: tff.Type, placement) -> bool:
    return isinstance(type_spec, tff.FederatedType) and type_spec.placement == placement


def _reason(computation: tff.Computation, error: Exception, form_name: str) -> str:
    """A plain-words cause for the TFF compilation errors we know, else ""."""
    if _BROADCAST_AFTER_AGGREGATE in str(error):
        return ("it runs more than one broadcast-aggregate round (e.g. a RoLoRA B round and the "
                "A round that broadcasts what it aggregated); compile each of the process's "
                "`rounds` instead (pass the process itself). ")
    if (form_name == "DistributeAggregateForm"
            and tff.framework.FEDERATED_AGGREGATE.uri in _intrinsic_uris(computation)):
        return ("it uses tff.federated_aggregate (e.g. FlexLoRA's or FLoRA's stacking), whose "
                "accumulate/merge/report functions TFF 0.87's DistributeAggregateForm compiler cannot place at "
                "SERVER; use to_map_reduce_form. ")
    return ""


def _intrinsic_uris(computation: tff.Computation) -> set[str]:
    """URIs of the federated intrinsics `computation` calls."""
    uris = set()

    def visit(building_block):
        if isinstance(building_block, tff.framework.Intrinsic):
            uris.add(building_block.uri)
        return building_block, False

    tff.framework.transform_preorder(computation.to_building_block(), visit)
    return uris


def _first_line(error: Exception) -> str:
    text = str(error).strip().splitlines()
    return text[0][:300] if text else ""
