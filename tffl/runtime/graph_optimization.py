"""How a federated computation is compiled for the TFF worker: with or without TFF's Grappler pass.

TFF 0.87's compiler for its C++ worker (`native_compiler.desugar_and_transform_to_native`)
replaces the intrinsics by TensorFlow bodies, brings the computation to call-dominant form, runs
one static Grappler pass in the driver over every TensorFlow graph of it (constant folding,
arithmetic, loop, function-inlining and memory optimizers, all AGGRESSIVE), and then marks every
function call in those graphs to run without Grappler on the worker (whose sessions run without
it anyway). On a Gemma 3 270M round that static pass is most of what a round kind spends before
its first step (docs/PERFORMANCE.md, "Where a Gemma 3 run's start-up and memory go").
`GRAPH_OPTIMIZATIONS` names the choices:

* `"tff"`: TFF's compiler as it is;
* `"none"`: the same steps without the static pass (TFF's `transform_to_native_form` with no
  Grappler configuration): the graphs run as traced.

Grappler rewrites graphs without changing what they compute, so both give the same results
to float32 rounding (tests/tffl/runtime/test_graph_optimization.py checks it on rounds of every
kind); they differ in start-up time, round time and memory, which `scripts/benchmark.py
--suite=targets --targets_parts=startup` measures side by side.

>>> comp = compiler("none")
>>> compiler("fast")
Traceback (most recent call last):
...
ValueError: graph optimization 'fast': choose from tff, none
"""

from __future__ import annotations

from collections.abc import Callable

from tffl.runtime.tff_internals import (
    computation_impl,
    context_stack_impl,
    native_compiler,
    tensorflow_tree_transformations,
)

GRAPH_OPTIMIZATIONS = ("tff", "none")
DEFAULT_GRAPH_OPTIMIZATION = "tff"

Compiler = Callable[[computation_impl.ConcreteComputation], computation_impl.ConcreteComputation]


def check_graph_optimization(graph_optimization: str) -> str:
    """`graph_optimization` if it is one of `GRAPH_OPTIMIZATIONS`, else ValueError (one line)."""
    if graph_optimization not in GRAPH_OPTIMIZATIONS:
        raise ValueError(f"graph optimization {graph_optimization!r}: choose from "
                         f"{', '.join(GRAPH_OPTIMIZATIONS)}")
    return graph_optimization


def compiler(graph_optimization: str = DEFAULT_GRAPH_OPTIMIZATION) -> Compiler:
    """The compiler function a TFF execution context for the worker takes (`compiler_fn`), for
    one of `GRAPH_OPTIMIZATIONS` (module docstring)."""
    check_graph_optimization(graph_optimization)
    if graph_optimization == "tff":
        return native_compiler.desugar_and_transform_to_native

    def without_static_pass(comp: computation_impl.ConcreteComputation
                            ) -> computation_impl.ConcreteComputation:
        # As `desugar_and_transform_to_native`: the intrinsics desugared first, then the rest.
        desugared, _ = tensorflow_tree_transformations.replace_intrinsics_with_bodies(
            comp.to_building_block())
        return native_compiler.transform_to_native_form(
            computation_impl.ConcreteComputation(computation_proto=desugared.proto,
                                                 context_stack=context_stack_impl.context_stack),
            grappler_config=None)

    return without_static_pass
