"""SRPFL vs FedRep on the linear synthetic task: simulated time to reach a target distance.

The library side of `scripts/srpfl_speedup.py` (whose docstring describes the protocol): for
each N and repeat, both methods run `tffl.algorithms.fedrep_linear`'s TFF process through
`tffl.simulation.driver.run_rounds`, SRPFL with `tffl.simulation.srpfl.SrpflSampler`, FedRep with all N clients
(`FullParticipationClock`); `summarize` gives rounds and simulated time to ε = ĉ × the N-client
floor, their ratio, and Theorem 4.6's bound

    E[T_SRPFL] / E[T_FedRep] ≤ (6(c+1) + 4 ln(1/(ĉ−1))) / (ln N + 2 ln(1/(ĉ−1))).

>>> round(theorem_4_6_speedup(1000, 0.0, 1.2), 3)  # (ln 1000 + 2 ln 5) / (6 + 4 ln 5) < 1
0.814
"""

from __future__ import annotations

import collections
import csv
import dataclasses
import functools
import math
import os
import pathlib
import time
from collections.abc import Callable, Sequence

import numpy as np

from runner import cli

STRAGGLERS = ("iid", "fixed", "dynamic")
METHODS = ("fedrep", "srpfl")
# Rounds whose previous distance is above this multiple of the floor are "transient" for the fit
# of the contraction constant a.
_TRANSIENT_FACTOR = 5.0
_FALLBACK_CONTRACTION = 0.25
# The metrics.csv column of the clients the TFF process counted (its client_work/train metric).
_NUM_CLIENTS = "client_work/train/num_clients"


@dataclasses.dataclass(frozen=True)
class SpeedupConfig:
    """Everything `run_comparison` needs (the flags, parsed). See the module docstring."""

    num_clients: tuple[int, ...] = (100, 1000)
    initial_participants: int = 10
    dim: int = 20
    rank: int = 2
    samples_per_client: int = 20
    noise_std: float = 0.1
    learning_rate: float = 0.5
    stage_rounds: int | str = "lemma_b1"
    contraction: float | str = "fit"
    straggler: str = "iid"
    communication_costs: tuple[float, ...] = (0.0, 1.0, 10.0)
    target_factor: float = 1.1
    fedrep_rounds: int = 30
    floor_window: int = 10
    max_rounds: int = 100
    init_clients: int = 100
    repeats: int = 3
    seed: int = 0
    log_every: int = 10


# ------------------------------------------------------------------------------------------------
# The comparison


def straggler_model(name: str):
    """The compute-time model of --straggler (see the module docstring)."""
    from tffl.simulation import srpfl_schedule

    if name == "iid":
        return srpfl_schedule.DynamicExponentialTimes(rate_low=1.0, rate_high=1.0)
    if name == "fixed":
        return srpfl_schedule.FixedExponentialTimes(rate=1.0)
    if name == "dynamic":
        return srpfl_schedule.DynamicExponentialTimes()
    raise ValueError(f"straggler={name!r}: choose from {', '.join(STRAGGLERS)}")


def round_seed(seed: int, round_num: int) -> int:
    """Seed of round `round_num`'s fresh batch (round 0: the initialization batch)."""
    return int(np.random.SeedSequence([seed, round_num]).generate_state(1)[0])


def first_round_at_or_below(distances: Sequence[float], target: float) -> int | None:
    """The first round t ≥ 1 (distances[t − 1] is the distance after round t) with
    distance ≤ target, or None."""
    for t, dist in enumerate(distances, start=1):
        if dist <= target:
            return t
    return None


def fit_contraction(initial_distance: float, distances: Sequence[float], floor: float
                    ) -> float | None:
    """a = 1 − ρ², ρ = median of dist_t / dist_{t−1} over rounds with dist_{t−1} > 5 × floor.

    None when fewer than two rounds are that far from the floor.
    """
    seq = [initial_distance, *distances]
    ratios = [seq[t] / seq[t - 1] for t in range(1, len(seq))
              if seq[t - 1] > _TRANSIENT_FACTOR * floor]
    if len(ratios) < 2:
        return None
    rho = float(np.median(ratios))
    return float(np.clip(1.0 - rho**2, 0.01, 0.99))


def theorem_4_6_speedup(num_clients: int, communication_cost: float, target_factor: float
                        ) -> float:
    """The speedup Theorem 4.6 guarantees for Exp(1) times (λ = 1, so c = C):
    (ln N + 2 ln(1/(ĉ−1))) / (6(C+1) + 4 ln(1/(ĉ−1))); NaN outside the theorem's 1 < ĉ < √2."""
    if not 1 < target_factor < math.sqrt(2):
        return math.nan
    log_c = math.log(1.0 / (target_factor - 1.0))
    return (math.log(num_clients) + 2 * log_c) / (6 * (communication_cost + 1) + 4 * log_c)


def _run_one(config: SpeedupConfig, process, num_clients: int, repeat: int,
             log: Callable[[str], None], output_dir: pathlib.Path) -> list[dict]:
    """Both methods on one problem (one N, one repeat); rows for every C and method.

    Each method is one `tffl.simulation.driver.run_rounds` run; its metrics.csv (a row per round, with
    `eval_distance` and the sampler's wall clock at C = 0) and last checkpoint go to
    `output_dir/fedrep` and `output_dir/srpfl`.
    """
    from tasks import subspace
    from tasks import synthetic
    from tffl.algorithms import fedrep_linear
    from tffl.engine import linear_engine
    from tffl.simulation import driver
    from tffl.simulation import srpfl
    from tffl.simulation import srpfl_schedule

    seed = config.seed + repeat
    tag = f"N={num_clients} repeat {repeat + 1}/{config.repeats}"
    problem = synthetic.fedrep_linear(
        num_clients, config.samples_per_client, config.dim, config.rank,
        noise_std=config.noise_std, seed=seed)
    ids = [f"client_{i:04d}" for i in range(num_clients)]
    index = {cid: i for i, cid in enumerate(ids)}

    @functools.lru_cache(maxsize=1)
    def batch(round_num):
        return problem.resample(round_seed(seed, round_num))

    def client_data(client_id: str, round_num: int) -> collections.OrderedDict:
        """Client `client_id`'s fresh batch of round `round_num` (round 0: the init batch)."""
        b, i = batch(round_num), index[client_id]
        return collections.OrderedDict(x=b.features[i].astype(np.float32),
                                       y=b.targets[i].astype(np.float32))

    def dist(state):
        return subspace.principal_angle_distance(linear_engine.get_representation(state),
                                                 problem.b_star)

    init_ids = ids[:min(config.init_clients or num_clients, num_clients)]
    state0 = fedrep_linear.initialize_by_moments(
        process, [client_data(cid, 0) for cid in init_ids])
    init_dist = dist(state0)
    model = straggler_model(config.straggler)

    def run(method, sampler, rounds, describe, target=None):
        """`run_rounds` from B⁰, dist(B^t, B*) after every round; stops at the first round with
        dist ≤ `target` (if given). Logs `describe(row)` every --log_every rounds."""
        started = time.perf_counter()

        def progress(row, state) -> None:
            del state
            if config.log_every and row["round"] % config.log_every == 0:
                log(f"  {tag} {method} round {describe(row)}, "
                    f"{time.perf_counter() - started:.1f} s")

        with cli.run_directory(output_dir / method) as run_dir:
            result = driver.run_rounds(
                process, sampler, client_data, rounds, run_dir, driver.RunOptions(
                    evaluate_fn=lambda state: {"distance": dist(state)}, eval_every=1,
                    checkpoint_every=rounds,
                    config=dataclasses.asdict(config) | dict(num_clients=num_clients,
                                                             repeat=repeat, method=method),
                    log=None, tensorboard=False, after_round=progress, initial_state=state0,
                    until=None if target is None else (
                        lambda row: row["eval_distance"] <= target)))
        return result.history, time.perf_counter() - started

    # FedRep: all N clients, a fixed number of rounds (its end defines the floor).
    history, seconds = run(
        "fedrep", srpfl.FullParticipationClock(ids, seed, model), config.fedrep_rounds,
        lambda row: (f"{row['round']}/{config.fedrep_rounds}: dist {row['eval_distance']:.5f}, "
                     f"{int(row[_NUM_CLIENTS])} clients"))
    fedrep_dists = [row["eval_distance"] for row in history]
    fedrep_counts = [int(row[_NUM_CLIENTS]) for row in history]
    window = fedrep_dists[-config.floor_window:]
    floor = float(np.median(window))
    target = config.target_factor * floor
    fedrep_hit = first_round_at_or_below(fedrep_dists, target)
    earlier = fedrep_dists[-2 * config.floor_window:-config.floor_window]
    plateau_note = ""
    if len(earlier) == config.floor_window and np.median(earlier) > 1.25 * floor:
        plateau_note = (f" (not yet flat: median of the {config.floor_window} rounds before is "
                        f"{np.median(earlier) / floor:.2f} × floor; raise --fedrep_rounds)")
    log(f"{tag} fedrep: {config.fedrep_rounds} rounds, {seconds:.1f} s; "
        f"init dist {init_dist:.4f}, floor {floor:.5f} (median of rounds "
        f"{config.fedrep_rounds - config.floor_window + 1}-{config.fedrep_rounds}){plateau_note}, "
        f"target {target:.5f}, reached at round {fedrep_hit}")

    # SRPFL's stage lengths.
    a = None
    if config.stage_rounds == "lemma_b1":
        if config.contraction == "fit":
            a = fit_contraction(init_dist, fedrep_dists, floor)
            if a is None:
                log(f"{tag}: too few FedRep rounds far from the floor to fit a; using a = "
                    f"{_FALLBACK_CONTRACTION}")
                a = _FALLBACK_CONTRACTION
        else:
            a = float(config.contraction)

    def sampler(cost):
        return srpfl.SrpflSampler(ids, config.initial_participants, seed, model,
                                  stage_rounds=config.stage_rounds, communication_cost=cost,
                                  lemma_b1_a=0.25 if a is None else a)

    schedule = sampler(0.0)
    stages = " ".join(f"{n}×{tau}" for n, tau in zip(schedule.sizes, schedule.stage_rounds))
    stages = f"{stages} {schedule.sizes[-1]}×∞".strip()

    # SRPFL: the fastest n_r each round, until the target.
    history, seconds = run(
        "srpfl", schedule, config.max_rounds,
        lambda row: (f"{row['round']}: dist {row['eval_distance']:.5f}, {row['clients']} clients "
                     f"(stage {row['stage']})"),
        target=target)
    srpfl_dists = [row["eval_distance"] for row in history]
    srpfl_counts = [int(row[_NUM_CLIENTS]) for row in history]
    srpfl_hit = first_round_at_or_below(srpfl_dists, target)
    log(f"{tag} srpfl: stages n×τ {stages}"
        + (f" (Lemma B.1, a = {a:.3f})" if a is not None else "")
        + f"; reached the target at round {srpfl_hit} "
        f"({history[-1]['clients']} clients), {seconds:.1f} s")

    expected = {n: srpfl_schedule.expected_order_statistic(n, num_clients)
                for n in set(schedule.sizes)} if config.straggler != "dynamic" else None
    common = dict(num_clients=num_clients, repeat=repeat, seed=seed, init_distance=init_dist,
                  floor=floor, target=target, contraction_a=a, stages=stages)
    rows = []
    for cost in config.communication_costs:
        clock = srpfl.FullParticipationClock(ids, seed, model, communication_cost=cost)
        srpfl_clock = sampler(cost)
        for method, hit, dists, counts, clock_fn in (
            ("fedrep", fedrep_hit, fedrep_dists, fedrep_counts, clock.simulated_time),
            ("srpfl", srpfl_hit, srpfl_dists, srpfl_counts, srpfl_clock.simulated_time),
        ):
            sizes = counts[:hit] if hit else []
            rows.append(common | dict(
                method=method,
                communication_cost=cost,
                rounds_to_target=hit,
                simulated_time=clock_fn(hit) if hit else math.nan,
                expected_time=(sum(expected[n] + cost for n in sizes)
                               if hit and expected is not None else math.nan),
                distances=tuple(dists),
                participants=tuple(counts),
            ))
        fedrep_row, srpfl_row = rows[-2], rows[-1]
        speedup = fedrep_row["simulated_time"] / srpfl_row["simulated_time"]
        fedrep_row["speedup"], srpfl_row["speedup"] = math.nan, speedup
    return rows


def run_comparison(config: SpeedupConfig, log: Callable[[str], None] = print,
                   output_dir: os.PathLike | str | None = None) -> list[dict]:
    """Runs FedRep and SRPFL for every N and repeat; one row per (N, repeat, C, method).

    Must run inside `tffl.runtime.local_runtime()`. Row keys: num_clients, repeat, seed (of the
    problem, the data and the compute times), method, communication_cost, init_distance, floor,
    target, contraction_a (None unless lemma_b1), stages, rounds_to_target (None if not reached),
    simulated_time, expected_time, speedup (SRPFL rows: FedRep time / SRPFL time; NaN on FedRep
    rows), distances (dist after rounds 1, 2, …) and participants (clients of rounds 1, 2, …, as
    counted by the TFF process).

    Every method's run goes through `tffl.simulation.driver.run_rounds`; its metrics.csv and checkpoint
    go to `output_dir/runs/N<N>_repeat<r>/<method>` (`output_dir` None: a temporary directory).
    """
    import tempfile

    from tffl.algorithms import fedrep_linear

    process = fedrep_linear.build_fedrep_linear(
        config.dim, config.rank, config.learning_rate, seed=config.seed)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        runs = pathlib.Path(output_dir or tmp) / "runs"
        for num_clients in config.num_clients:
            for repeat in range(config.repeats):
                rows.extend(_run_one(config, process, num_clients, repeat, log,
                                     runs / f"N{num_clients}_repeat{repeat + 1}"))
    return rows


# ------------------------------------------------------------------------------------------------
# Tables


def _fmt(value, spec="{:.2f}") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "—"
    return spec.format(value)


def summarize(config: SpeedupConfig, rows: list[dict]) -> list[dict]:
    """Means over repeats per (N, C, method); speedup = mean FedRep time / mean SRPFL time."""
    summary = []
    for num_clients in config.num_clients:
        for cost in config.communication_costs:
            group = {m: [r for r in rows if r["num_clients"] == num_clients
                         and r["communication_cost"] == cost and r["method"] == m]
                     for m in METHODS}
            means = {}
            for method in METHODS:
                rs = group[method]
                reached = [r for r in rs if r["rounds_to_target"] is not None]
                all_reached = len(reached) == len(rs)
                means[method] = dict(
                    num_clients=num_clients,
                    communication_cost=cost,
                    method=method,
                    repeats=len(rs),
                    reached=len(reached),
                    rounds_to_target=(float(np.mean([r["rounds_to_target"] for r in rs]))
                                      if all_reached else math.nan),
                    simulated_time=(float(np.mean([r["simulated_time"] for r in rs]))
                                    if all_reached else math.nan),
                    expected_time=(float(np.mean([r["expected_time"] for r in rs]))
                                   if all_reached else math.nan),
                    speedup=math.nan,
                    speedups=tuple(r["speedup"] for r in rs),
                    theorem_speedup=(theorem_4_6_speedup(num_clients, cost, config.target_factor)
                                     if config.straggler != "dynamic" else math.nan),
                )
            means["srpfl"]["speedup"] = (means["fedrep"]["simulated_time"]
                                         / means["srpfl"]["simulated_time"])
            summary.extend(means[m] for m in METHODS)
    return summary


def format_tables(config: SpeedupConfig, rows: list[dict]) -> str:
    """The Markdown tables the script prints: the speedup table and the per-repeat details."""
    header = ("| N | C | method | rounds to target | simulated time to target | E[time] of those "
              "rounds | speedup (FedRep / SRPFL) | per-repeat speedups | Thm 4.6 guaranteed "
              "speedup |")
    lines = [header, "|" + "---|" * 9]
    for s in summarize(config, rows):
        srpfl_row = s["method"] == "srpfl"
        rounds = (_fmt(s["rounds_to_target"], "{:.1f}") if s["reached"] == s["repeats"]
                  else f"not reached in {s['repeats'] - s['reached']} of {s['repeats']}")
        lines.append("| " + " | ".join([
            str(s["num_clients"]),
            f"{s['communication_cost']:g}",
            "SRPFL" if srpfl_row else "FedRep",
            rounds,
            _fmt(s["simulated_time"]),
            _fmt(s["expected_time"]),
            _fmt(s["speedup"]) if srpfl_row else "",
            " / ".join(_fmt(x) for x in s["speedups"]) if srpfl_row else "",
            _fmt(s["theorem_speedup"]) if srpfl_row else "",
        ]) + " |")
    detail = ["| N | repeat | init dist | N-client floor | target | FedRep rounds | SRPFL rounds "
              "| SRPFL stages n×τ |", "|" + "---|" * 8]
    for r in rows:
        if r["method"] != "srpfl" or r["communication_cost"] != config.communication_costs[0]:
            continue
        fedrep = next(x for x in rows if x["method"] == "fedrep" and x["seed"] == r["seed"]
                      and x["num_clients"] == r["num_clients"])
        stages = r["stages"] + (f" (a = {r['contraction_a']:.2f})"
                                if r["contraction_a"] is not None else "")
        detail.append("| " + " | ".join([
            str(r["num_clients"]), str(r["repeat"] + 1), f"{r['init_distance']:.3f}",
            f"{r['floor']:.5f}", f"{r['target']:.5f}", _fmt(fedrep["rounds_to_target"], "{}"),
            _fmt(r["rounds_to_target"], "{}"), stages,
        ]) + " |")
    return "\n".join(lines) + "\n\n" + "\n".join(detail)


_CSV_COLUMNS = ("num_clients", "repeat", "seed", "method", "communication_cost",
                "init_distance", "floor", "target", "contraction_a", "stages",
                "rounds_to_target", "simulated_time", "expected_time", "speedup")


def write_outputs(output_dir: pathlib.Path, config: SpeedupConfig, rows: list[dict], tables: str,
                  command: str) -> None:
    with open(output_dir / "srpfl_speedup.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=_CSV_COLUMNS, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    (output_dir / "srpfl_speedup.md").write_text(
        f"    {command}\n\n{dataclasses.asdict(config)}\n\n{tables}\n")
