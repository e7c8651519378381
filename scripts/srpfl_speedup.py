r"""SRPFL vs FedRep on the linear synthetic task: simulated time to reach a target distance.

Theorem 4.6 of SRPFL (shared/specs/srpfl.md §4.6) bounds the ratio of expected wall-clock times
to reach ε = ĉ × (the N-client floor),

    E[T_SRPFL] / E[T_FedRep] ≤ (6(c+1) + 4 ln(1/(ĉ−1))) / (ln N + 2 ln(1/(ĉ−1))),

so SRPFL's advantage grows like log N. This script measures both times for every N in
--num_clients (default 100 and 1000) and prints the table.

    python scripts/srpfl_speedup.py                      # N = 100, 1000: 3-5 min on 2 CPUs
    python scripts/srpfl_speedup.py --num_clients=100 --repeats=1 --communication_cost=0,1,10

What is run, for each N and each repeat (seed = --seed + repeat; a new problem, new data and new
compute times per repeat):

* Problem: `tasks.synthetic.fedrep_linear`, y = w_i*ᵀ B*ᵀ x + z with B* ∈ R^{d×k} orthonormal,
  its own head w_i* per client (‖w_i*‖ = √k) and z ~ N(0, σ²). Algorithm 2 draws a fresh batch of
  m samples per client per round: round t's batch is `resample` of a seed derived from
  (seed, t), the same draw for both methods (a client selected by SRPFL in round t sees exactly
  the batch FedRep's copy of it sees). Round 0's batch is used only for the initialization.
* Initialization, shared by both methods: B⁰ = method of moments (`initialize_by_moments`, the
  top-k eigenvectors of the mean of P_i = (1/m) Σ_j y_ij² x_ij x_ijᵀ) over the first
  min(--init_clients, N) clients (0: all N, as Algorithm 2 writes it). The default, 100 clients,
  gives every N the same initial distance, which is what Theorem 4.6 assumes (a constant E0;
  Lemma B.3 starts FedRep at a constant distance, so FedRep needs ~½ log N more rounds to reach
  a floor ∝ 1/√N). With all N clients the initial distance itself shrinks like 1/√N, the rate of
  the floor, so FedRep's rounds to ε no longer grow with N and that part of the log N advantage
  goes away (docs/RESULTS.md shows both). The init round is charged to neither method.
* Both methods run the same TFF process, `tffl.algorithms.fedrep_linear` (exact least-squares heads, one
  gradient step on B with step η, server mean and QR).
* FedRep: all N clients every round, for exactly --fedrep_rounds rounds. A round's wall clock is
  the slowest of the N compute times plus the communication cost C (`FullParticipationClock`).
* The N-client floor is the median of dist(B^t, B*) (principal-angle distance,
  `tasks.subspace.principal_angle_distance`) over FedRep's last --floor_window rounds; the target
  is ε = ĉ × floor with ĉ = --target_factor. The paper needs 1 < ĉ so that ε is reachable, and
  ĉ below √(N / n_last) (n_last the stage before all N; √2 when N/n0 is a power of 2) so that ε
  needs all N clients; the script says so when ĉ is above that.
* SRPFL: `tffl.simulation.srpfl.SrpflSampler` picks the n_r fastest of the N clients of each round
  (n_r = min(N, n0·2^r), stage r lasting τ_r rounds, the last stage open-ended) and the round's
  data list is built from exactly those client ids; a round's wall clock is the slowest selected
  compute time plus C. SRPFL stops at the first round with dist ≤ ε, or after --max_rounds.
  Stage lengths (--stage_rounds): an int τ for every stage, or `lemma_b1`, Lemma B.1's τ_r
  (`lemma_b1_stage_rounds`) for the contraction constant a of Theorem 4.5 (dist⁺ ≈ √(1−a) dist
  away from the floor). --contraction gives a, or `fit` estimates it from the FedRep run of the
  same repeat: ρ = median of dist_t / dist_{t−1} over the FedRep rounds whose previous distance is
  above 5 × floor, a = 1 − ρ² (the theorem's own a = ½ η E0 σ̄²_min is a loose lower bound and
  gives stages several times longer than needed).
* Compute times (--straggler): `iid` (default), i.i.d. Exp(1) redrawn every round, the model of
  Theorem 4.6 (redrawn per round, Remark 3.1); `fixed`, one Exp(1) draw per client for the whole
  run (the paper's Figs 3 and 5); `dynamic`, λ_i ~ U[1/N, 1] once and Exp(λ_i) every round (the
  paper's Figs 4 and 6). Both methods see the same times (same seed).

Reported, per N, C and method (means over --repeats):

* rounds to target: the first round t ≥ 1 with dist(B^t, B*) ≤ ε;
* simulated time to target: Σ_{s ≤ t} (slowest participant of round s + C), i.e. the sampler's
  and the clock's `simulated_time(t)`;
* E[time]: the same sum with each slowest time replaced by its expectation under Exp(1),
  E[𝒯_(n)] = H_N − H_{N−n} (`expected_order_statistic`), i.e. the time the measured rounds cost
  on average; `iid`/`fixed` only;
* speedup: FedRep time / SRPFL time, per repeat, and as mean FedRep time / mean SRPFL time (the
  ratio of expectations of Theorem 4.6);
* Thm 4.6 bound: the speedup the theorem guarantees, (ln N + 2 ln(1/(ĉ−1))) / (6(C+1) +
  4 ln(1/(ĉ−1))) with λ = 1; a value below 1 guarantees nothing.

Writes `srpfl_speedup.csv` (one row per N, repeat, method and C) and `srpfl_speedup.md` (the
flags and the printed tables) to --output_dir (default runs/srpfl_speedup), and the TFF worker's
log to `tff_worker.log`. Both methods run through `tffl.simulation.driver.run_rounds` (sampler
`FullParticipationClock` or `SrpflSampler`, the round's fresh batch per client id, dist(B^t, B*)
as `eval_distance` after every round; SRPFL with `until` = the target), one run per N, repeat and
method in `runs/N<N>_repeat<r>/{fedrep,srpfl}/` (metrics.csv, last checkpoint; the sampler's
`simulated_time` column there is at C = 0). A rerun into the same --output_dir replaces them.
A bad flag is one line on stderr and exit status 2 (TFFL_DEBUG=1 re-raises).
"""

from __future__ import annotations

import os
import sys
import warnings

# Quiet TensorFlow's C++ logs before it is imported, unless the user asked for verbosity.
if not any(a.startswith(("--verbosity", "-v")) for a in sys.argv[1:]):
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    warnings.filterwarnings("ignore", message="pkg_resources is deprecated")

import math  # noqa: E402
import pathlib  # noqa: E402
import time  # noqa: E402
from collections.abc import Callable  # noqa: E402

from absl import app  # noqa: E402
from absl import flags  # noqa: E402

from runner import cli  # noqa: E402
from runner import tensorflow_import  # noqa: E402
from runner.cli import UsageError  # noqa: E402

# TensorFlow, TFF and the tffl/tasks modules (which import them) are imported only after the
# flags are validated, so that a bad flag fails in about a second.

from experiments.srpfl_speedup import (  # noqa: E402
    STRAGGLERS, SpeedupConfig, format_tables, run_comparison, write_outputs)

def define_flags(flag_values: flags.FlagValues) -> None:
    """Defines the script's flags in `flag_values` (absl's global FLAGS when run; a
    FlagValues of its own in a test), registered for this module: run as a script, absl's
    --helpshort lists them."""
    d = cli.definer(flag_values)
    d.DEFINE_list("num_clients", "100,1000",
                  "N, or a comma-separated list of N: clients (all sampled every round).")
    d.DEFINE_integer("initial_participants", 10,
                     "n0, SRPFL's participants in its first stage (1 <= n0 <= N).")
    d.DEFINE_integer("dim", 20, "d, the feature dimension.")
    d.DEFINE_integer("rank", 2, "k, the representation dimension (1 <= k <= d).")
    d.DEFINE_integer("samples_per_client", 20, "m, fresh samples per client per round (>= k).")
    d.DEFINE_float("noise_std", 0.1, "σ, the label noise std (>= 0).")
    d.DEFINE_float("learning_rate", 0.5, "η, the step on B (> 0).")
    d.DEFINE_string(
        "stage_rounds", "lemma_b1",
        "SRPFL rounds per stage: an int τ > 0 for every stage, or lemma_b1 (Lemma B.1 with a = "
        "--contraction).")
    d.DEFINE_string(
        "contraction", "fit",
        "a of Theorem 4.5 for --stage_rounds=lemma_b1: a number in (0, 1), or fit (from the "
        "FedRep run: a = 1 − ρ², ρ the median per-round distance ratio away from the floor).")
    d.DEFINE_enum(
        "straggler", "iid", STRAGGLERS,
        "Compute times: iid (Exp(1) redrawn every round, Theorem 4.6), fixed (one Exp(1) draw per "
        "client), dynamic (λ_i ~ U[1/N, 1], Exp(λ_i) every round).")
    d.DEFINE_list(
        "communication_cost", "0,1,10", "C >= 0 added to every round's wall clock; a list gives "
        "rows for each (the runs do not depend on C).")
    d.DEFINE_float(
        "target_factor", 1.1, "ĉ > 1: the target distance is ĉ × the N-client floor.")
    d.DEFINE_integer(
        "fedrep_rounds", 30, "Rounds FedRep runs; its last --floor_window rounds give the floor.")
    d.DEFINE_integer(
        "floor_window", 10, "The floor is the median distance of FedRep's last this many rounds.")
    d.DEFINE_integer(
        "max_rounds", 100, "SRPFL stops at the target or after this many rounds.")
    d.DEFINE_integer(
        "init_clients", 100,
        "The first min(this, N) clients' moments give the shared initial B (0: all N, as "
        "Algorithm 2). A fixed number keeps the initial distance independent of N, as Theorem 4.6 "
        "assumes.")
    d.DEFINE_integer("repeats", 3, "Independent repeats per N (seeds seed, seed+1, …).")
    d.DEFINE_integer("seed", 0, "Base seed (>= 0) of problem, data and compute times.")
    d.DEFINE_integer("log_every", 10, "Print a progress line every this many rounds "
                     "(0: only one line per run).")
    d.DEFINE_string("output_dir", "runs/srpfl_speedup", "Where the tables go.")


# ------------------------------------------------------------------------------------------------
# Flags -> SpeedupConfig


def _int_list(fv: flags.FlagValues, name: str) -> tuple[int, ...]:
    return cli.int_list(name, fv[name].value)


def _float_list(fv: flags.FlagValues, name: str) -> tuple[float, ...]:
    return cli.float_list(name, fv[name].value)


_at_least = cli.at_least


def config_from_flags(fv: flags.FlagValues) -> SpeedupConfig:
    """Validates the flags together; raises `UsageError` (one line naming the flag)."""
    num_clients = _num_clients(fv)
    n0 = fv.initial_participants
    _at_least("initial_participants", n0, 1)
    if n0 > min(num_clients):
        raise UsageError(f"flag --initial_participants={n0}: must be <= every --num_clients "
                         f"(smallest N = {min(num_clients)})")
    _check_problem_flags(fv)
    stage_rounds = _stage_rounds(fv)
    contraction = _contraction(fv)
    costs = _communication_costs(fv)
    target_factor = fv.target_factor
    if not (math.isfinite(target_factor) and target_factor > 1):
        raise UsageError(f"flag --target_factor={target_factor}: must be > 1 (the target is "
                         "ĉ × the floor, and the floor itself is only reached on average)")
    _check_run_flags(fv)
    return SpeedupConfig(
        num_clients=num_clients,
        initial_participants=n0,
        dim=fv.dim,
        rank=fv.rank,
        samples_per_client=fv.samples_per_client,
        noise_std=fv.noise_std,
        learning_rate=fv.learning_rate,
        stage_rounds=stage_rounds,
        contraction=contraction,
        straggler=fv.straggler,
        communication_costs=costs,
        target_factor=target_factor,
        fedrep_rounds=fv.fedrep_rounds,
        floor_window=fv.floor_window,
        max_rounds=fv.max_rounds,
        init_clients=fv.init_clients,
        repeats=fv.repeats,
        seed=fv.seed,
        log_every=fv.log_every,
    )


def _num_clients(fv: flags.FlagValues) -> tuple[int, ...]:
    """--num_clients: distinct values >= 1."""
    num_clients = _int_list(fv, "num_clients")
    for n in num_clients:
        _at_least("num_clients", n, 1)
    if len(set(num_clients)) != len(num_clients):
        raise UsageError(f"flag --num_clients={','.join(map(str, num_clients))}: values repeat")
    return num_clients


def _check_problem_flags(fv: flags.FlagValues) -> None:
    """--dim, --rank, --samples_per_client, --noise_std and --learning_rate."""
    _at_least("dim", fv.dim, 1)
    _at_least("rank", fv.rank, 1)
    if fv.rank > fv.dim:
        raise UsageError(f"flag --rank={fv.rank}: must be <= --dim={fv.dim}")
    if fv.samples_per_client < fv.rank:
        raise UsageError(f"flag --samples_per_client={fv.samples_per_client}: must be >= --rank="
                         f"{fv.rank} (each client solves its k-dimensional head)")
    if not (math.isfinite(fv.noise_std) and fv.noise_std >= 0):
        raise UsageError(f"flag --noise_std={fv.noise_std}: must be a finite number >= 0")
    if not (math.isfinite(fv.learning_rate) and fv.learning_rate > 0):
        raise UsageError(f"flag --learning_rate={fv.learning_rate}: must be a finite "
                         "number > 0")


def _stage_rounds(fv: flags.FlagValues) -> int | str:
    """--stage_rounds: an int > 0, or lemma_b1."""
    stage_rounds: int | str = fv.stage_rounds
    if stage_rounds != "lemma_b1":
        try:
            stage_rounds = int(stage_rounds)
        except ValueError:
            raise UsageError(f"flag --stage_rounds={stage_rounds}: must be an int > 0 or "
                             "lemma_b1") from None
        _at_least("stage_rounds", stage_rounds, 1)
    return stage_rounds


def _contraction(fv: flags.FlagValues) -> float | str:
    """--contraction: a number in (0, 1), or fit."""
    contraction: float | str = fv.contraction
    if contraction != "fit":
        try:
            contraction = float(contraction)
        except ValueError:
            contraction = float("nan")
        if not 0 < contraction < 1:
            raise UsageError(f"flag --contraction={fv.contraction}: must be a number in "
                             "(0, 1) or fit")
    return contraction


def _communication_costs(fv: flags.FlagValues) -> tuple[float, ...]:
    """--communication_cost: finite numbers >= 0."""
    costs = _float_list(fv, "communication_cost")
    for c in costs:
        if not (math.isfinite(c) and c >= 0):
            raise UsageError(f"flag --communication_cost={','.join(fv.communication_cost)}: "
                             f"{c} must be a finite number >= 0")
    return costs


def _check_run_flags(fv: flags.FlagValues) -> None:
    """--fedrep_rounds, --floor_window, --max_rounds, --init_clients, --repeats, --seed and
    --log_every."""
    _at_least("fedrep_rounds", fv.fedrep_rounds, 2)
    _at_least("floor_window", fv.floor_window, 1)
    if fv.floor_window >= fv.fedrep_rounds:
        raise UsageError(f"flag --floor_window={fv.floor_window}: must be < --fedrep_rounds="
                         f"{fv.fedrep_rounds} (the floor is the end of a longer run)")
    _at_least("max_rounds", fv.max_rounds, 1)
    _at_least("init_clients", fv.init_clients, 0)
    _at_least("repeats", fv.repeats, 1)
    _at_least("seed", fv.seed, 0)
    _at_least("log_every", fv.log_every, 0)


def _output_dir(fv: flags.FlagValues) -> pathlib.Path:
    output_dir = cli.writable_output_dir(fv.output_dir)
    return output_dir


# ------------------------------------------------------------------------------------------------
# main


def _warn_about_target(config: SpeedupConfig, log: Callable[[str], None]) -> None:
    """The paper's fairness condition: ε must need all N clients, ĉ < √(N / n_last)."""
    for n in config.num_clients:
        sizes = [config.initial_participants]
        while sizes[-1] < n:
            sizes.append(min(n, 2 * sizes[-1]))
        if len(sizes) >= 2 and config.target_factor >= math.sqrt(n / sizes[-2]):
            log(f"note: N={n}: --target_factor={config.target_factor} >= √(N/{sizes[-2]}) = "
                f"{math.sqrt(n / sizes[-2]):.3f}, so SRPFL's stage with {sizes[-2]} clients "
                "already has a floor below the target (the paper wants ĉ below this)")


def main(argv: list[str]) -> int:
    try:
        if len(argv) > 1:
            raise UsageError(f"unexpected arguments: {' '.join(argv[1:])} (flags are --name=value)")
        config = config_from_flags(flags.FLAGS)
        output_dir = _output_dir(flags.FLAGS)
    except UsageError as e:
        return cli.error_exit("srpfl_speedup.py", e, 2)
    cli.quiet_python_logs()

    def log(line: str) -> None:
        print(line, flush=True)

    # Imported here so a bad flag does not wait for TensorFlow; also installs the exit hook that
    # stops any TFF worker.
    from tffl import runtime

    command = "python scripts/srpfl_speedup.py " + " ".join(sys.argv[1:])
    log(f"srpfl_speedup: N = {', '.join(map(str, config.num_clients))}; d={config.dim}, "
        f"k={config.rank}, m={config.samples_per_client}, σ={config.noise_std}, "
        f"η={config.learning_rate}, n0={config.initial_participants}, ĉ={config.target_factor}, "
        f"C = {', '.join(f'{c:g}' for c in config.communication_costs)}, {config.straggler} "
        f"Exp times, init from {config.init_clients or 'all N'} clients' moments, "
        f"{config.repeats} repeat(s) -> {output_dir}")
    _warn_about_target(config, log)
    started = time.perf_counter()
    try:
        with runtime.local_runtime(log_dir=output_dir):
            rows = run_comparison(config, log=log, output_dir=output_dir)
    except (ValueError, FloatingPointError, OSError) as e:
        return cli.error_exit("srpfl_speedup.py", e, 1)
    tables = format_tables(config, rows)
    write_outputs(output_dir, config, rows, tables, command.strip())
    print("\n" + tables + "\n", flush=True)
    print(f"Floor = median FedRep (all N) distance over its last {config.floor_window} of "
          f"{config.fedrep_rounds} rounds; target = {config.target_factor} × floor. Times are "
          "simulated (Exp(1) compute times; slowest participant + C per round). "
          f"{time.perf_counter() - started:.0f} s. Results in {output_dir}", flush=True)
    return 0


def parse(argv: list[str], flag_values: flags.FlagValues) -> tuple[SpeedupConfig, pathlib.Path]:
    """Parses `argv` into `flag_values` (holding `define_flags`' flags) and checks the values
    together, creating the output folder; returns the config and the folder. A bad flag is one
    line on stderr and `SystemExit(2)`, as on the command line; nothing heavy is imported."""
    cli.parse_flags(argv, flag_values, __doc__)
    try:
        return config_from_flags(flag_values), _output_dir(flag_values)
    except UsageError as e:
        sys.exit(cli.error_exit("srpfl_speedup.py", e, 2))


if __name__ == "__main__":
    define_flags(flags.FLAGS)
    app.run(main, flags_parser=tensorflow_import.importing_tensorflow(cli.parse_flags))
