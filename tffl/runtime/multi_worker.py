"""Several TFF workers as one context: a computation's clients split over them (see `tffl.runtime`)."""


from __future__ import annotations

import asyncio
import logging
import math
import threading
from collections.abc import Sequence

from tffl.runtime.tff_internals import (
    async_utils,
    building_block_factory,
    building_blocks,
    cardinalities_utils,
    computation_impl,
    computation_types,
    context_base,
    context_stack_impl,
    mergeable_comp_compiler,
    mergeable_comp_execution_context,
    placements,
    structure,
    tensorflow_computation,
    tensorflow_tree_transformations,
    transformation_utils,
    transformations,
    type_analysis,
    type_conversions,
)

from tffl.runtime.graph_optimization import DEFAULT_GRAPH_OPTIMIZATION
from tffl.runtime.guarded import (
    create_async_worker_context,
    create_worker_context,
    rerun_after_a_crash,
)
from tffl.runtime.worker_connection import DEFAULT_READY_TIMEOUT_S, Worker

_log = logging.getLogger(__name__)


# --- Splitting computations with several layers of aggregations --------------------------------


def _is_aggregation(value: building_blocks.ComputationBuildingBlock) -> bool:
    return (
        isinstance(value, building_blocks.Call)
        and isinstance(value.function, building_blocks.Intrinsic)
        and bool(value.function.intrinsic_def().aggregation_kind)
    )


def _free_names(value: building_blocks.ComputationBuildingBlock) -> set[str]:
    return transformation_utils.get_map_of_unbound_references(value)[value]


def _closure(bindings: Sequence[tuple[str, object]], roots: set[str]) -> set[str]:
    """Names of `bindings` that `roots` need, directly or through other bindings."""
    uses = {name: _free_names(value) for name, value in bindings}
    needed: set[str] = set()
    todo = list(roots)
    while todo:
        name = todo.pop()
        if name in uses and name not in needed:
            needed.add(name)
            todo.extend(uses[name])
    return needed


def _call_dominant(comp: computation_impl.ConcreteComputation) -> building_blocks.Lambda:
    """`comp` as the call-dominant lambda TFF's mergeable compiler works on: intrinsics lowered
    (e.g. `federated_mean` to `federated_aggregate`), one block of bindings under the lambda."""
    lam = mergeable_comp_compiler._ensure_lambda(comp.to_building_block())  # noqa: SLF001
    lowered, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(lam)
    return building_blocks.Lambda(
        lowered.parameter_name,
        lowered.parameter_type,
        transformations.to_call_dominant(lowered.result),
    )


def split_at_aggregation_layers(
    lam: building_blocks.Lambda,
) -> list[building_blocks.Lambda]:
    """Cuts a call-dominant lambda into stages with one layer of aggregations each.

    The first layer = the aggregations that consume no aggregation's result. Stage 1 computes
    them from the argument `x` and returns them (`<a_1, ..., a_n>`, all SERVER-placed); stage 2
    takes `<x, <a_1, ..., a_n>>` and computes the rest, with the bindings it needs from before
    the layer (e.g. broadcasts of the argument) recomputed and unneeded ones dropped; stage 2 is
    cut again if it still has dependent aggregations. Running the stages in order, each fed the
    original argument and the previous stage's result, computes `lam`. A lambda whose
    aggregations are all independent (or without parameter) comes back as the single stage.
    """
    body = lam.result
    if lam.parameter_name is None or not isinstance(body, building_blocks.Block):
        return [lam]
    bindings = list(body.locals)
    after_aggregation: dict[str, bool] = {}
    first_layer: list[str] = []
    dependent = False
    for name, value in bindings:
        consumes = any(after_aggregation.get(n, False) for n in _free_names(value))
        if _is_aggregation(value):
            if consumes:
                dependent = True
            else:
                first_layer.append(name)
        after_aggregation[name] = consumes or _is_aggregation(value)
    if not dependent:
        return [lam]

    types = {name: value.type_signature for name, value in bindings}
    stage1_needs = _closure(bindings, set(first_layer))
    stage1_result = building_blocks.Struct(
        [building_blocks.Reference(n, types[n]) for n in first_layer]
    )
    stage1 = building_blocks.Lambda(
        lam.parameter_name,
        lam.parameter_type,
        building_blocks.Block(
            [(n, v) for n, v in bindings if n in stage1_needs], stage1_result
        ),
    )

    parameter = next(building_block_factory.unique_name_generator(lam))
    parameter_type = computation_types.StructType(
        [lam.parameter_type, stage1_result.type_signature]
    )
    ref = building_blocks.Reference(parameter, parameter_type)
    results = building_blocks.Selection(ref, index=1)
    rebound = [(lam.parameter_name, building_blocks.Selection(ref, index=0))]
    rebound += [
        (n, building_blocks.Selection(results, index=i)) for i, n in enumerate(first_layer)
    ]
    rest = rebound + [(n, v) for n, v in bindings if n not in first_layer]
    stage2_needs = _closure(rest, _free_names(body.result))
    stage2 = building_blocks.Lambda(
        parameter,
        parameter_type,
        building_blocks.Block([(n, v) for n, v in rest if n in stage2_needs], body.result),
    )
    return [stage1, *split_at_aggregation_layers(stage2)]


def compile_to_mergeable_stages(
    comp: computation_impl.ConcreteComputation,
) -> list[mergeable_comp_execution_context.MergeableCompForm]:
    """`comp` as a list of TFF `MergeableCompForm`s run in order (see `MultiWorkerContext`).

    One form (TFF's `compile_to_mergeable_comp_form` on `comp` itself) when its aggregations are
    independent; else one per stage of `split_at_aggregation_layers`, the last one typed with
    `comp`'s result type (so results keep their Python containers).

    Raises:
      Whatever TFF's compiler raises for a computation it cannot express in mergeable form.
    """
    lam = _call_dominant(comp)
    stages = split_at_aggregation_layers(lam)
    if len(stages) == 1:
        return [mergeable_comp_compiler.compile_to_mergeable_comp_form(comp)]
    forms = []
    for k, stage in enumerate(stages):
        stage_comp = computation_impl.ConcreteComputation(
            computation_proto=stage.proto, context_stack=context_stack_impl.context_stack
        )
        if k == len(stages) - 1:
            stage_comp = computation_impl.ConcreteComputation.with_type(
                stage_comp,
                computation_types.FunctionType(
                    stage_comp.type_signature.parameter, comp.type_signature.result
                ),
            )
        forms.append(mergeable_comp_compiler.compile_to_mergeable_comp_form(stage_comp))
    return forms


def _has_clients_values(type_spec: computation_types.Type | None) -> bool:
    if type_spec is None:
        return False
    return type_analysis.contains(
        type_spec,
        lambda t: isinstance(t, computation_types.FederatedType)
        and t.placement is placements.CLIENTS
        and not t.all_equal,
    )


def split_clients(value, type_spec: computation_types.Type, num_parts: int) -> list:
    """`value` (of type `type_spec`) cut into at most `num_parts` values with contiguous groups of
    its clients, as TFF's mergeable context cuts them (group i has ceil(remaining / parts left)
    clients); every CLIENTS-placed (not all-equal) value is sliced alike, the rest is repeated.

    TFF 0.87's own `_split_value_into_subrounds` gets this wrong when the last element of a struct
    is not CLIENTS-placed (e.g. `<<state, data>, server_result>`): its clients counter does not
    advance and every group gets the same first clients.
    """
    n = cardinalities_utils.infer_cardinalities(value, type_spec).get(placements.CLIENTS)
    if not n:
        return [value]
    bounds, low = [], 0
    for parts_left in range(num_parts, 0, -1):
        size = math.ceil((n - low) / parts_left)
        if size == 0:
            break
        bounds.append((low, low + size))
        low += size
    return [_slice_clients(value, type_spec, low, high) for low, high in bounds]


def _slice_clients(value, type_spec: computation_types.Type, low: int, high: int):
    if isinstance(type_spec, computation_types.StructType):
        elements = structure.iter_elements(structure.from_container(value))
        return structure.Struct([
            (name, _slice_clients(element, element_type, low, high))
            for (_, element), (name, element_type) in zip(
                elements, structure.iter_elements(type_spec)
            )
        ])
    if (
        isinstance(type_spec, computation_types.FederatedType)
        and type_spec.placement is placements.CLIENTS
        and not type_spec.all_equal
    ):
        return list(value)[low:high]
    return value


class MultiWorkerContext(context_base.SyncContext):
    """Runs computations on K workers, splitting their clients with TFF's mergeable machinery.

    A computation whose argument holds CLIENTS-placed values is compiled once to the stages of
    `compile_to_mergeable_stages`. Each stage runs as TFF's `MergeableCompExecutionContext` runs
    a `MergeableCompForm` (its `_invoke_mergeable_comp_form`, one asynchronous remote context per
    worker): the argument is cut into K contiguous client groups (`split_clients`), worker i runs
    `up_to_merge` on group i, the partial aggregates are merged as they arrive, and `after_merge`
    runs on one worker (or on every group, for CLIENTS-placed results, concatenated). Stage k > 1
    gets `<argument, result of stage k - 1>`. Other computations, and those TFF cannot compile to
    mergeable form, run whole on worker 0; the names and reasons of the latter are in `unsplit`.
    A local worker that crashes during a call is restarted and the call run again, once
    (`rerun_after_a_crash`).

    Args:
      workers: started workers (`LocalWorker` or connected `RemoteWorker`).
      default_num_clients: CLIENTS cardinality used when a computation cannot infer it.
      ready_timeout_s: how long a worker may take to answer again before `WorkerError`.
      graph_optimization: one of `graph_optimization.GRAPH_OPTIMIZATIONS`: whether TFF's
        compiler runs its Grappler pass on the graphs.
    """

    def __init__(
        self,
        workers: Sequence[Worker],
        default_num_clients: int = 0,
        ready_timeout_s: float = DEFAULT_READY_TIMEOUT_S,
        graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION,
    ):
        if not workers:
            raise ValueError("MultiWorkerContext needs at least one worker")
        self.workers = list(workers)
        self._ready_timeout_s = ready_timeout_s
        self.whole = create_worker_context(workers[0], default_num_clients, ready_timeout_s,
                                           graph_optimization)
        self.async_contexts = [
            create_async_worker_context(w, default_num_clients, ready_timeout_s,
                                        graph_optimization)
            for w in workers
        ]
        self._runner = async_utils.AsyncThreadRunner()
        self.unsplit: dict[str, str] = {}
        # id(comp) -> (comp, stages or None); holding comp keeps its id unique.
        self._compiled: dict[int, tuple[object, list | None]] = {}
        self._lock = threading.Lock()

    def _stages(self, comp) -> list | None:
        with self._lock:
            found = self._compiled.get(id(comp))
            if found is not None and found[0] is comp:
                return found[1]
            try:
                stages = compile_to_mergeable_stages(comp)
            except Exception as e:  # noqa: BLE001 - any compiler failure: run it whole
                name = getattr(comp, "name", None) or str(comp.type_signature)
                reason = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
                self.unsplit[name] = reason
                _log.warning("tffl.runtime: %s runs on one worker (not split): %s", name, reason)
                stages = None
            self._compiled[id(comp)] = (comp, stages)
            return stages

    def run_stage(self, form: mergeable_comp_execution_context.MergeableCompForm, arg):
        """One `MergeableCompForm` on `arg`, its clients split across the workers."""
        parts = split_clients(arg, form.up_to_merge.type_signature.parameter, len(self.workers))
        result = self._runner.run_coro_and_return_result(self._run_form(form, parts))
        return type_conversions.type_to_py_container(
            result, form.after_merge.type_signature.result
        )

    async def _run_form(self, form, parts):
        tff_pool = mergeable_comp_execution_context  # TFF's (private) mergeable execution steps
        try:
            # up_to_merge on each group (group i on worker i), partial results merged as they come.
            merged, merge_context = await tff_pool._invoke_merge_in_async_pool(  # noqa: SLF001
                form, parts, self.async_contexts
            )
            result_type = form.after_merge.type_signature.result
            if not _has_clients_values(result_type):
                return await tff_pool._compute_after_merged(  # noqa: SLF001
                    form, parts[0], merged, merge_context
                )
            # CLIENTS-placed results: after_merge on every group, concatenated in group order.
            # (TFF's `_invoke_after_merge_in_async_pool` concatenates in completion order, which
            # hands clients each other's values.)
            results = await asyncio.gather(*[
                tff_pool._compute_after_merged(form, part, merged, context)  # noqa: SLF001
                for part, context in zip(parts, self.async_contexts)
            ])
            repackage = tff_pool._repackage_partitioned_values  # noqa: SLF001
            return repackage(list(results), result_type)
        except BaseException:
            # Stop the other groups' tasks so they do not fail later unobserved ("Task exception
            # was never retrieved").
            for task in asyncio.all_tasks():
                if task is not asyncio.current_task():
                    task.cancel()
            raise

    def invoke(self, comp, arg):
        if arg is None or not isinstance(comp, computation_impl.ConcreteComputation) or (
            not _has_clients_values(comp.type_signature.parameter)
        ):
            return self.whole.invoke(comp, arg)
        stages = self._stages(comp)
        if stages is None:
            return self.whole.invoke(comp, arg)  # restarts worker 0 if it crashes

        def run_stages():
            result = None
            for k, form in enumerate(stages):
                result = self.run_stage(
                    form, arg if k == 0 else structure.Struct.unnamed(arg, result))
            return result

        result = rerun_after_a_crash(self.workers, self._ready_timeout_s, run_stages)
        return tensorflow_computation.transform_result(result)


