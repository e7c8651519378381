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
  `process.communication_rounds["b_round"]` and `["a_round"]` and call them alternately (what
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
`next` returns `OrderedDict(state=..., metrics=...)` instead of a `LearningProcessOutput`.
`save_process` / `load_process` store a process's `initialize` and communication rounds (and its
schedule's first rounds, for the record) as files.

Example:

>>> forms = to_map_reduce_form(process)            # {round name: MapReduceForm}
>>> sorted(forms)
['a_round', 'b_round']
>>> _ = save_process(process, run_dir / "rolora")
>>> saved = load_process(run_dir / "rolora")
>>> with runtime.local_runtime():
...     state = saved.initialize()
...     output = saved.communication_rounds["b_round"](state, client_datasets)
>>> sorted(output)                                 # containers come back as OrderedDicts
['metrics', 'state']
"""

from __future__ import annotations

import collections
import dataclasses
import json
import pathlib
from collections.abc import Callable, Mapping
from typing import Any

import tensorflow_federated as tff
from tensorflow_federated.proto.v0 import computation_pb2

_MANIFEST = "manifest.json"
_BROADCAST_AFTER_AGGREGATE = "broadcast dependent on aggregate"


def to_map_reduce_form(process_or_computation, name: str | None = None):
    """TFF's `MapReduceForm` of a round, or of each communication round of a process.

    Args:
      process_or_computation: a federated computation `(state@S, data@C) -> (state@S, out@S)`
        (e.g. `process.communication_rounds["b_round"]`), or a process: an object with
        `communication_rounds` (`tffl.engine.processes`) or `next`, whose round kinds (else `next`)
        are compiled one by one.
      name: what error messages call it (default: the process's `algorithm`, else "computation").

    Returns:
      A `tff.backends.mapreduce.MapReduceForm` for a computation; for a process, an
      `OrderedDict` {round name: `MapReduceForm`} in the order the process runs its rounds.

    Raises:
      ValueError: naming the algorithm and the reason, if the computation does not have the
        signature of one round (e.g. a personalized round, whose clients keep personal state) or
        TFF cannot compile it.
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


@dataclasses.dataclass(frozen=True)
class SavedProcess:
    """A process read back by `load_process`: `initialize() -> state@S`, `communication_rounds`
    {name: computation} in order, `schedule` (the round names of communication rounds
    t = 0, 1, ... as saved, for the record) and `next`: the one round's computation when there
    is a single round kind, the cycle's (`tffl.engine.schedules.compose_cycle`, e.g. RoLoRA's B round
    then A round) when the process had one, else None (call the rounds in the schedule's
    order)."""

    algorithm: str
    initialize: tff.Computation
    next: tff.Computation | None
    communication_rounds: Mapping[str, tff.Computation]
    schedule: tuple[str, ...] = ()


_SCHEDULE_RECORD = 8  # communication rounds of the schedule written to the manifest


def save_process(process, directory) -> pathlib.Path:
    """Writes `process`'s computations to `directory` (created if needed) and returns it.

    Files: `initialize.pb`, one `round_<k>.pb` per round kind, `next.pb` for a process whose
    `next` is a cycle of several rounds, and `manifest.json` (algorithm, round names and files,
    the schedule of the first communication rounds).
    """
    directory = pathlib.Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    rounds = getattr(process, "communication_rounds", None) or {"next": process.next}
    round_files = [(name, f"round_{k}.pb") for k, name in enumerate(rounds)]
    files = {"initialize.pb": process.initialize}
    files.update((filename, rounds[name]) for name, filename in round_files)
    cycle = len(rounds) > 1 and isinstance(getattr(process, "next", None), tff.Computation)
    if cycle:
        files["next.pb"] = process.next
    for filename, computation in files.items():
        (directory / filename).write_bytes(serialize(computation))
    schedule = getattr(process, "schedule", None)
    manifest = {
        "algorithm": getattr(process, "algorithm", "process"),
        "initialize": "initialize.pb",
        "communication_rounds": round_files,
        "next": "next.pb" if cycle else None,
        "schedule": [schedule(t) for t in range(_SCHEDULE_RECORD)] if schedule else [],
    }
    (directory / _MANIFEST).write_text(json.dumps(manifest, indent=2) + "\n")
    return directory


def load_process(directory) -> SavedProcess:
    """The computations `save_process` wrote to `directory`, deserialized.

    Raises:
      FileNotFoundError: `directory` has no `manifest.json` or a listed file is missing.
    """
    directory = pathlib.Path(directory)
    manifest = json.loads((directory / _MANIFEST).read_text())

    def load(filename: str) -> tff.Computation:
        return deserialize((directory / filename).read_bytes())

    rounds = collections.OrderedDict(
        (name, load(filename)) for name, filename in manifest["communication_rounds"])
    return SavedProcess(
        algorithm=manifest["algorithm"],
        initialize=load(manifest["initialize"]),
        next=(load(manifest["next"]) if manifest.get("next")
              else next(iter(rounds.values())) if len(rounds) == 1 else None),
        communication_rounds=rounds,
        schedule=tuple(manifest.get("schedule", ())),
    )


def _compile(target, name: str | None, form_name: str, compiler: Callable[[Any], Any]):
    """`compiler` applied to a computation, or to each communication round of a process."""
    if isinstance(target, tff.Computation):
        return _compile_round(target, name or "computation", form_name, compiler)
    name = name or getattr(target, "algorithm", type(target).__name__)
    rounds = getattr(target, "communication_rounds", None)
    if rounds is None:
        rounds = {"next": target.next}
    return collections.OrderedDict(
        (round_name, _compile_round(comp, f"{name} ({round_name})", form_name, compiler))
        for round_name, comp in rounds.items())


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
                "`communication_rounds` instead (pass the process itself). ")
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
