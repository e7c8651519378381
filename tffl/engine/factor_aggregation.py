"""Aggregations of LoRA factors that a `tff.aggregators` mean cannot express: sums of the
clients' products A_iB_i, which are bilinear in what the clients upload.

Notation: per adapter, A ∈ R^{d_in×r}, B ∈ R^{r×d_out} at the server at the start of the round,
A_i, B_i after client i's local training, ΔA_i = A_i − A, ΔB_i = B_i − B, and weights
p_i = n_i/Σ_j n_j (a weighted `tff.aggregators` factory) or 1/N (an unweighted one).

- `stacking_aggregation` (FLoRA, FlexLoRA): clients upload (A_i, B_i); a `tff.federated_aggregate`
  accumulates Σ_i p_i·A_iB_i per adapter (FLoRA's stacking [p_1A_1 … p_NA_N]·[B_1; …; B_N]), so
  the upload stays r·(d_in + d_out) values per adapter; the other deltas go to the factory.
- `averaging_error_aggregation` + `averaging_error_measure` (FedAvg-LoRA's diagnostic, RoLoRA
  paper): how far averaging the factors separately is from averaging the products,

      averaging_error = ‖Ā·B̄ − mean(A_iB_i)‖_F / ‖mean(A_iB_i) − A·B‖_F,
      Ā = Σ p_i A_i,  B̄ = Σ p_i B_i,  mean(A_iB_i) = Σ p_i A_iB_i,

  the squared Frobenius norms summed over all adapters (numerator and denominator separately;
  the LoRA scale cancels). From the uploaded deltas alone (Σ p_i = 1):

      Ā·B̄ − mean(A_iB_i)  = mean(ΔA_i)·mean(ΔB_i) − mean(ΔA_iΔB_i),
      mean(A_iB_i) − A·B  = A·mean(ΔB_i) + mean(ΔA_i)·B + mean(ΔA_iΔB_i),

  so the aggregation sums p_iΔA_i, p_iΔB_i and p_iΔA_iΔB_i of each client's own deltas and the
  finalizer, which holds A and B, forms the ratio. A simulation-only measurement: it needs every
  client's ΔA_i and ΔB_i at the server (a real deployment would upload them a second time, or
  the products), and that extra upload is not counted in the process's bytes per client.
"""

from __future__ import annotations

import collections
from collections.abc import Sequence

import numpy as np
import tensorflow as tf
import tensorflow_federated as tff


def stacking_aggregation(update_type, factory, weighted: bool) -> tff.templates.AggregationProcess:
    """The aggregation of a (factors, deltas) update: ([Σ_i p_i A_iB_i per adapter], the deltas'
    aggregate by `factory`), p_i = n_i/Σn if `weighted`, else 1/N."""
    factors_type, deltas_type = update_type[0], update_type[1]
    dims = [(f[0].shape[0], f[1].shape[1]) for f in factors_type]
    dtype = factors_type[0][0].dtype
    # Without extra-role deltas there is nothing for `factory` to aggregate (it would only
    # upload the weight n_i a second time).
    inner = factory.create(deltas_type, tff.TensorType(np.float32)) if len(deltas_type) else None

    @tff.tensorflow.computation
    def zero():
        return collections.OrderedDict(products=[tf.zeros(d, dtype) for d in dims],
                                       weight=tf.constant(0.0, tf.float32))

    acc_type = zero.type_signature.result

    @tff.tensorflow.computation(acc_type, (factors_type, np.float32))
    def accumulate(acc, value):
        factors, weight = value
        weight = weight if weighted else tf.constant(1.0, tf.float32)
        return collections.OrderedDict(
            products=[p + tf.cast(weight, p.dtype) * (a @ b)
                      for p, (a, b) in zip(acc["products"], factors)],
            weight=acc["weight"] + weight)

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(x, y):
        return collections.OrderedDict(
            products=[p + q for p, q in zip(x["products"], y["products"])],
            weight=x["weight"] + y["weight"])

    @tff.tensorflow.computation(acc_type)
    def report(acc):
        return [tf.math.divide_no_nan(p, tf.cast(acc["weight"], p.dtype))
                for p in acc["products"]]

    @tff.federated_computation
    def initialize():
        return inner.initialize() if inner else tff.federated_value((), tff.SERVER)

    @tff.federated_computation(initialize.type_signature.result,
                               tff.FederatedType(update_type, tff.CLIENTS),
                               tff.FederatedType(np.float32, tff.CLIENTS))
    def next_fn(state, value, weight):
        products = tff.federated_aggregate(tff.federated_zip((value[0], weight)), zero(),
                                           accumulate, merge, report)
        if inner is None:
            return tff.templates.MeasuredProcessOutput(
                state, tff.federated_zip((products, tff.federated_value([], tff.SERVER))),
                tff.federated_value(collections.OrderedDict(), tff.SERVER))
        out = inner.next(state, value[1], weight)
        return tff.templates.MeasuredProcessOutput(
            out.state, tff.federated_zip((products, out.result)), out.measurements)

    return tff.templates.AggregationProcess(initialize, next_fn)


def _delta_sums(update_type, pairs, weighted: bool):
    """`tff.federated_aggregate`'s (zero, accumulate, merge, report) of the p_i-weighted means
    of ΔA_i, ΔB_i and ΔA_iΔB_i; `pairs`: (position of ΔA, of ΔB) in the update list."""
    dtype = update_type[pairs[0][0]].dtype
    shapes_a = [tuple(update_type[a].shape) for a, _ in pairs]
    shapes_b = [tuple(update_type[b].shape) for _, b in pairs]
    keys = ("delta_a", "delta_b", "delta_product")

    @tff.tensorflow.computation
    def zero():
        return collections.OrderedDict(
            delta_a=[tf.zeros(s, dtype) for s in shapes_a],
            delta_b=[tf.zeros(s, dtype) for s in shapes_b],
            delta_product=[tf.zeros((sa[0], sb[1]), dtype) for sa, sb in zip(shapes_a, shapes_b)],
            weight=tf.constant(0.0, tf.float32))

    acc_type = zero.type_signature.result

    @tff.tensorflow.computation(acc_type, (update_type, np.float32))
    def accumulate(acc, value):
        deltas, weight = value
        weight = weight if weighted else tf.constant(1.0, tf.float32)
        p = tf.cast(weight, dtype)
        return collections.OrderedDict(
            delta_a=[s + p * deltas[a] for s, (a, _) in zip(acc["delta_a"], pairs)],
            delta_b=[s + p * deltas[b] for s, (_, b) in zip(acc["delta_b"], pairs)],
            delta_product=[s + p * (deltas[a] @ deltas[b])
                           for s, (a, b) in zip(acc["delta_product"], pairs)],
            weight=acc["weight"] + weight)

    @tff.tensorflow.computation(acc_type, acc_type)
    def merge(x, y):
        out = collections.OrderedDict(
            (k, [u + v for u, v in zip(x[k], y[k])]) for k in keys)
        out["weight"] = x["weight"] + y["weight"]
        return out

    @tff.tensorflow.computation(acc_type)
    def report(acc):
        total = tf.cast(acc["weight"], dtype)
        return collections.OrderedDict(
            (k, [tf.math.divide_no_nan(s, total) for s in acc[k]]) for k in keys)

    return zero, accumulate, merge, report


def averaging_error_aggregation(inner: tff.templates.AggregationProcess, update_type,
                                pairs: Sequence[tuple[int, int]], weighted: bool
                                ) -> tff.templates.AggregationProcess:
    """`inner` (the algorithm's aggregation of the delta list `update_type`), its result paired
    with {delta_a, delta_b, delta_product}: per adapter mean(ΔA_i), mean(ΔB_i), mean(ΔA_iΔB_i)
    with weights p_i (`weighted`: n_i/Σn, else 1/N); `pairs` are the (ΔA, ΔB) positions in the
    update list. State and measurements are `inner`'s."""
    zero, accumulate, merge, report = _delta_sums(update_type, tuple(pairs), weighted)
    params = inner.next.type_signature.parameter

    @tff.federated_computation(params[0], params[1], params[2])
    def next_fn(state, value, weight):
        out = inner.next(state, value, weight)
        sums = tff.federated_aggregate(tff.federated_zip((value, weight)), zero(), accumulate,
                                       merge, report)
        return tff.templates.MeasuredProcessOutput(
            out.state, tff.federated_zip((out.result, sums)), out.measurements)

    return tff.templates.AggregationProcess(inner.initialize, next_fn)


def averaging_error_measure(weights_type, pairs: Sequence[tuple[int, int]], aggregate_type
                            ) -> tff.Computation:
    """`(w, (update, sums), round_num) -> {averaging_error}` (module docstring; `aggregate_type`
    is `averaging_error_aggregation`'s result), with A, B = w.trainable[a], w.trainable[b] for
    each (a, b) of `pairs` (in the order of `sums`' lists), in float64:

        num² = Σ_adapters ‖mean(ΔA_i)·mean(ΔB_i) − mean(ΔA_iΔB_i)‖²_F,
        den² = Σ_adapters ‖A·mean(ΔB_i) + mean(ΔA_i)·B + mean(ΔA_iΔB_i)‖²_F,
        averaging_error = num/den (0 if den = 0)."""
    pairs = tuple(pairs)

    @tff.tensorflow.computation(weights_type, aggregate_type, np.int32)
    def measure(weights, aggregate, round_num):
        del round_num
        sums = aggregate[1]
        num2 = tf.constant(0.0, tf.float64)
        den2 = tf.constant(0.0, tf.float64)
        for (a, b), da, db, dp in zip(pairs, sums["delta_a"], sums["delta_b"],
                                      sums["delta_product"]):
            a0, b0 = (tf.cast(weights.trainable[k], tf.float64) for k in (a, b))
            da, db, dp = (tf.cast(v, tf.float64) for v in (da, db, dp))
            num2 += tf.reduce_sum(tf.square(da @ db - dp))
            den2 += tf.reduce_sum(tf.square(a0 @ db + da @ b0 + dp))
        return collections.OrderedDict(
            averaging_error=tf.cast(tf.math.divide_no_nan(tf.sqrt(num2), tf.sqrt(den2)),
                                    tf.float32))

    return measure
