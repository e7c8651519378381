"""experiments/sst2's run order and table, with train.py replaced by a recorder that writes the
summary a finished run would (no training: the order is what is under test)."""

import csv
import dataclasses
import json
import pathlib
import shutil

import pytest

from experiments import running
from experiments import sst2


def _value(args, flag):
    return next(str(a).split("=", 1)[1] for a in args if str(a).startswith(f"--{flag}="))


def test_each_method_runs_its_grid_then_its_first_seed_at_every_n_before_other_seeds(
        tmp_path, monkeypatch):
    """... and the centralized run comes right after FedAvg-LoRA, the pair that decides
    whether the budget is large enough."""
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3), seeds=2,
               clients=(3, 20))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    monkeypatch.setattr(sst2, "SST2_CLAIM_METHODS",
                        {m: sst2.SST2_CLAIM_METHODS[m]
                         for m in ("rolora", "fedavg_lora", "ffa_lora")})
    runs = []

    def fake_train(args, what):
        run_dir = pathlib.Path(_value(args, "output_dir"))
        method, n, seed, lr = run_dir.relative_to(tmp_path).parts[:4]
        runs.append((method, n, seed, lr))
        rounds = int(_value(args, "rounds"))
        accuracy = 0.8 if lr == "lr0.3" else 0.6  # 0.3 wins every grid
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": rounds, "communication_rounds": rounds,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy + 0.01}}))

    monkeypatch.setattr(sst2, "run_subprocess", fake_train)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=False, seed=0,
                          data_dir=tmp_path)
    rows, chosen, _ = sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], True)
    grid = [("lr0.1",), ("lr0.3",)]
    expected = []
    for method, ns in (("rolora", ("N3", "N20")), ("fedavg_lora", ("N3", "N20")),
                       ("centralized", ("N1",)), ("ffa_lora", ("N3", "N20"))):
        expected += [(method, ns[0], "seed0") + lr for lr in grid]      # the grid
        expected += [(method, n, "seed0", "lr0.3") for n in ns[1:]]      # seed 0, other N
    for method, ns in (("rolora", ("N3", "N20")), ("fedavg_lora", ("N3", "N20")),
                       ("centralized", ("N1",)), ("ffa_lora", ("N3", "N20"))):
        expected += [(method, n, "seed1", "lr0.3") for n in ns]          # then seed 1
    assert runs == expected
    assert set(chosen.values()) == {0.3}
    assert {r["seeds_done"] for r in rows} == {"2/2"}
    assert {r["test_accuracy"] for r in rows} == {"0.8100 ± 0.0000"}


def _fake_train(tmp_path, runs):
    """A train.py that records its run and writes the summary a finished run would."""
    def fake_train(args, what):
        run_dir = pathlib.Path(_value(args, "output_dir"))
        runs.append(run_dir.relative_to(run_dir.parents[3]).parts)
        rounds = int(_value(args, "rounds"))
        accuracy = 0.8 if _value(args, "learning_rate") == "0.3" else 0.6
        run_dir.mkdir(parents=True)
        (run_dir / "metrics.csv").write_text(f"round\n{rounds}\n")
        (run_dir / "checkpoints").mkdir()
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": rounds, "communication_rounds": rounds,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy + 0.01}}))
    return fake_train


@pytest.mark.parametrize("grid_every_n", [False, True])
def test_methods_filter_largest_n_first_and_archive_restores_without_running(
        tmp_path, monkeypatch, grid_every_n):
    """--methods runs only the named methods; after the grid the first seed goes to the largest
    N first (with grid_every_n, the grid at every N); finished runs are archived (summary.json,
    metrics.csv, no checkpoints), and a fresh output folder with the same archive re-runs
    nothing and gives the same table."""
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3), seeds=1,
               clients=(3, 20, 50), grid_every_n=grid_every_n)
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    runs = []
    monkeypatch.setattr(sst2, "run_subprocess", _fake_train(tmp_path, runs))
    archive = tmp_path / "archive"

    def protocol(output_dir):
        ctx = running.Context("sst2_clients", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("flora",), archive_dir=archive)
        return sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], True)

    rows, chosen, _ = protocol(tmp_path / "first")
    if grid_every_n:
        expected = [("flora", n, "seed0", lr) for n in ("N3", "N50", "N20")
                    for lr in ("lr0.1", "lr0.3")]
        grid = "0.1: 0.6000, 0.3: 0.8000"
        assert [r["grid"] for r in rows] == [grid, grid, grid]
    else:
        expected = [("flora", "N3", "seed0", "lr0.1"), ("flora", "N3", "seed0", "lr0.3"),
                    ("flora", "N50", "seed0", "lr0.3"), ("flora", "N20", "seed0", "lr0.3")]
        assert [r["grid"] for r in rows] == ["0.1: 0.6000, 0.3: 0.8000", None, None]
    assert runs == expected
    assert chosen == {("flora", 3): 0.3, ("flora", 20): 0.3, ("flora", 50): 0.3}
    assert [r["clients"] for r in rows] == [3, 20, 50]
    kept = sorted(p.relative_to(archive).as_posix() for p in archive.rglob("*") if p.is_file())
    assert kept == sorted(f"flora/{n}/seed0/{lr}/{f}" for _, n, _, lr in expected
                          for f in ("metrics.csv", "summary.json"))
    runs.clear()
    again, _, _ = protocol(tmp_path / "fresh_checkout")
    assert runs == [] and again == rows
    # An unfinished archived copy is not taken for a finished run: it runs again.
    summary = archive / "flora/N20/seed0/lr0.3/summary.json"
    summary.write_text(json.dumps(dict(json.loads(summary.read_text()), rounds_completed=0)))
    protocol(tmp_path / "third")
    assert runs == [("flora", "N20", "seed0", "lr0.3")]


def test_a_stopped_run_keeps_its_newest_checkpoint_in_the_archive_and_resumes_from_it(
        tmp_path, monkeypatch):
    """A sitting stopped mid-run (here: train.py fails after checkpointing rounds 2 and 3) keeps
    the run's newest checkpoint and metrics in the archive; on a fresh output folder the run is
    resumed from it (--resume); once finished, the archive keeps no checkpoint."""
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=1, clients=(3,))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    calls = []
    finish = _fake_train(tmp_path, [])

    def stopped_train(args, what):
        calls.append(args)
        run_dir = pathlib.Path(_value(args, "output_dir"))
        for r in (2, 3):
            (run_dir / "checkpoints" / f"round_{r:06d}").mkdir(parents=True)
            (run_dir / "checkpoints" / f"round_{r:06d}" / "meta.json").write_text(str(r))
        (run_dir / "checkpoints" / "round_000004").mkdir()  # incomplete: no meta.json
        (run_dir / "metrics.csv").write_text("round\n1\n2\n3\n")
        raise running.StepError("train.py was stopped")

    archive = tmp_path / "archive"

    def protocol(output_dir):
        ctx = running.Context("sst2_clients", "small", output_dir, resume=True, seed=0,
                              data_dir=tmp_path, methods=("rolora",), archive_dir=archive)
        return sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], False)

    monkeypatch.setattr(sst2, "run_subprocess", stopped_train)
    with pytest.raises(running.StepError):
        protocol(tmp_path / "first")
    kept = archive / "rolora/N3/seed0/lr0.3"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "checkpoints/round_000003/meta.json", "metrics.csv"]

    def resumed_train(args, what):
        calls.append(args)
        run_dir = pathlib.Path(_value(args, "output_dir"))
        assert (run_dir / "checkpoints/round_000003/meta.json").read_text() == "3"
        assert (run_dir / "metrics.csv").read_text() == "round\n1\n2\n3\n"
        shutil.rmtree(run_dir)
        finish(args, what)

    monkeypatch.setattr(sst2, "run_subprocess", resumed_train)
    rows, _, _ = protocol(tmp_path / "fresh_checkout")
    assert "--resume" not in calls[0] and "--resume" in calls[1]
    assert rows[0]["seeds_done"] == "1/1"
    assert sorted(p.relative_to(kept).as_posix() for p in kept.rglob("*") if p.is_file()) == [
        "metrics.csv", "summary.json"]


def _train_to_accuracy(monkeypatch, accuracy_of):
    """Replaces train.py by runs that end at dev and test accuracy `accuracy_of(lr)`; returns
    the list the runs' folder names are appended to, in order."""
    runs = []

    def fake_train(args, what):
        run_dir = pathlib.Path(_value(args, "output_dir"))
        runs.append(run_dir.name)
        accuracy = accuracy_of(float(_value(args, "learning_rate")))
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": int(_value(args, "rounds")), "communication_rounds": 1,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": accuracy, "eval_test_accuracy": accuracy}}))

    monkeypatch.setattr(sst2, "run_subprocess", fake_train)
    return runs


@pytest.mark.parametrize("best, ran", [
    (0.3, ["lr0.1", "lr0.3", "lr1"]),                    # inside the grid: no edge rate
    (3.0, ["lr0.1", "lr0.3", "lr1", "lr3"]),             # at the top edge: 3.0, now inside
    (10.0, ["lr0.1", "lr0.3", "lr1", "lr3"]),            # still at the edge: none left above
    (0.01, ["lr0.1", "lr0.3", "lr1", "lr0.03", "lr0.01"]),  # at the bottom: 0.03, then 0.01
])
def test_a_best_rate_at_the_grids_edge_brings_in_the_next_rate_beyond_it(
        tmp_path, monkeypatch, best, ran):
    """Dev accuracy peaks at `best` (falls with |log(lr / best)|); the grid 0.1, 0.3, 1.0 is
    extended by the edge rates beyond the edge where its best sits, nearest first, until the
    best is inside or none is left; the chosen rate is the best of all that ran."""
    import math
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3, 1.0), seeds=1,
               clients=(3,), edge_rates=(0.01, 0.03, 3.0))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    runs = _train_to_accuracy(monkeypatch, lambda lr: 0.9 - 0.05 * abs(math.log(lr / best)))
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=("rolora",))
    rows, chosen, grids = sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], False)
    assert runs == ran
    expected = min((float(r[2:]) for r in ran), key=lambda r: abs(math.log(r / best)))
    assert chosen == {("rolora", 3): expected}
    assert list(grids[("rolora", 3)]) == sorted(float(r[2:]) for r in ran)
    assert rows[0]["learning_rate"] == expected


def test_a_tie_goes_to_the_smaller_rate_and_brings_in_no_edge_rate(tmp_path, monkeypatch):
    """FlexLoRA under label skew (seed 0) ended lr 0.3 and lr 1.0 at the same dev accuracy,
    702 of 872 sentences: the smaller rate, inside the grid, is chosen, and lr 3.0 does not
    run."""
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.1, 0.3, 1.0), seeds=1,
               clients=(3,), edge_rates=(0.03, 3.0))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    dev = {0.1: 647 / 872, 0.3: 702 / 872, 1.0: 702 / 872}
    runs = _train_to_accuracy(monkeypatch, dev.get)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=("flexlora",))
    rows, chosen, _ = sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], False)
    assert runs == ["lr0.1", "lr0.3", "lr1"]
    assert chosen == {("flexlora", 3): 0.3} and rows[0]["learning_rate"] == 0.3


def test_a_damaged_archived_summary_is_one_error_naming_the_file(tmp_path, monkeypatch):
    """A summary.json in the archive that is not JSON stops the experiment with a ValueError
    (reproduce.py: one line) that names the file, instead of a JSON traceback."""
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=1, clients=(3,))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    monkeypatch.setattr(sst2, "run_subprocess", _fake_train(tmp_path, []))
    damaged = tmp_path / "archive/rolora/N3/seed0/lr0.3/summary.json"
    damaged.parent.mkdir(parents=True)
    damaged.write_text('{"rounds_completed": 6,')  # cut short
    ctx = running.Context("sst2_clients", "small", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path, methods=("rolora",), archive_dir=tmp_path / "archive")
    with pytest.raises(ValueError, match=str(damaged)):
        sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], False)


def _protocol_with_finals(tmp_path, monkeypatch, cfg, final_of, methods):
    """Runs `sst2._sst2_protocol` at `cfg` with every train.py run replaced by a summary.json
    whose "final" is `final_of(method, N, seed)` (None: a stopped run, no summary); returns its
    rows, its result and the drops table (drops.csv) by method."""
    from experiments import report

    def fake_train(args, what):
        run_dir = pathlib.Path(_value(args, "output_dir"))
        method, n, seed = run_dir.relative_to(tmp_path).parts[:3]
        final = final_of(method, int(n[1:]), int(seed[4:]))
        if final is None:
            return
        rerun = final.pop("rerun", None)   # a rerun recorded by archive.attach_rerun
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": int(_value(args, "rounds")), "communication_rounds": 1,
            "upload_bytes_per_client_total": 0, "final": final,
            **({"rerun": {"final": rerun}} if rerun else {})}))

    monkeypatch.setattr(sst2, "run_subprocess", fake_train)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=methods)
    rows, _, _ = sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"],
                                     "centralized" in methods)
    result = sst2._sst2_claim_result(ctx, rows, "IID")
    report.write_table(tmp_path / "out", result.extra_tables["drops"], "drops")
    with open(tmp_path / "out" / "drops.csv", newline="") as f:
        return rows, result, {r["method"]: r for r in csv.DictReader(f)}


def test_degradation_table_pairs_drops_by_seed_against_numpy(tmp_path, monkeypatch):
    """drops.csv: a method's drop from N = 3 to N is 100·(a(3, s) − a(N, s)) over the seeds
    finished at both, mean ± sample std (ddof = 1; numpy below), each seed's drop listed; a seed
    missing at one N leaves only that pair; FedSA-LoRA's drop is on its personalized dev
    accuracy; the paper's drop is the difference of its Table 1 means; the centralized run (one
    N) has no row."""
    import numpy as np
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=3, clients=(3, 20))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    rng = np.random.default_rng(7)
    accuracy = {(m, n, s): float(rng.uniform(0.6, 0.9)) for m in ("rolora", "fedsa_lora")
                for n in (3, 20) for s in range(3)}

    def final(method, n, seed):
        if (method, n, seed) == ("rolora", 20, 2):
            return None  # stopped: no summary
        a = accuracy.get((method, n, seed), 0.7)
        return ({"eval_personal_accuracy": a} if method == "fedsa_lora"
                else {"eval_accuracy": a, "eval_test_accuracy": a})

    _, result, table = _protocol_with_finals(tmp_path, monkeypatch, cfg, final,
                                             ("rolora", "fedsa_lora", "centralized"))
    assert set(table) == {"RoLoRA", "FedSA-LoRA"}
    for method, name, seeds, measure in (("rolora", "RoLoRA", (0, 1), "test"),
                                         ("fedsa_lora", "FedSA-LoRA", (0, 1, 2),
                                          "personalized dev")):
        d = np.array([100 * (accuracy[method, 3, s] - accuracy[method, 20, s]) for s in seeds])
        assert table[name]["drop_20"] == f"{d.mean():.2f} ± {d.std(ddof=1):.2f}"
        assert table[name]["seeds_20"] == str(len(seeds))
        assert table[name]["per_seed_20"] == ", ".join(f"{s}: {x:.2f}" for s, x in zip(seeds, d))
        assert table[name]["measure"] == measure
    assert float(table["RoLoRA"]["paper_drop_20"]) == pytest.approx(95.49 - 94.88)
    assert table["FedSA-LoRA"]["paper_drop_20"] == ""
    markdown = (tmp_path / "out" / "drops.md").read_text()
    assert "| drop 3 → 20 (points) | seeds 3 & 20 | per seed 3 → 20 (seed: points) |" in markdown


@pytest.mark.parametrize("missing, reran", [(None, False), ((20, 1), False), ((20, 1), True)])
def test_fedsa_lora_drops_are_on_personalized_test_only_when_every_run_has_it(
        tmp_path, monkeypatch, missing, reran):
    """FedSA-LoRA's runs report personalized accuracy on the clients' dev and test shards: its
    test column and drops use the test figures when every finished run has one; when one run
    (from before the test split was cut per client) lacks it, every seed of the method falls
    back to personalized dev, so that no drop pairs a dev figure with a test one, unless a
    rerun of that run recorded in its summary (archive.attach_rerun) has the test figure: that
    one is used, its dev figure is not, and a note names the run."""
    import numpy as np
    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=2, clients=(3, 20))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    rng = np.random.default_rng(3)
    dev = {(n, s): float(rng.uniform(0.6, 0.9)) for n in (3, 20) for s in range(2)}
    test = {(n, s): float(rng.uniform(0.6, 0.9)) for n in (3, 20) for s in range(2)}

    def final(method, n, seed):
        out = {"eval_personal_accuracy": dev[n, seed]}
        if (n, seed) != missing:
            out["eval_personal_test_accuracy"] = test[n, seed]
        elif reran:
            out["rerun"] = {"eval_personal_accuracy": 0.5, "eval_personal_test_accuracy":
                            test[n, seed]}
        return out

    rows, result, table = _protocol_with_finals(tmp_path, monkeypatch, cfg, final,
                                                ("fedsa_lora",))
    (row,) = table.values()
    used = dev if missing and not reran else test
    reran_notes = [n for n in result.table.notes if "rerun" in n]
    assert reran_notes == ([f"Test figures from a rerun with the same flags and seed, the run "
                            f"having kept no checkpoint to evaluate (its summary.json's "
                            f"`rerun`), with the run's dev figure → the rerun's: FedSA-LoRA, "
                            f"N = 20, seed 1 (dev {dev[20, 1]:.4f} → 0.5000)."]
                           if reran else [])
    d = np.array([100 * (used[3, s] - used[20, s]) for s in (0, 1)])
    assert row["measure"] == ("personalized dev" if used is dev else "personalized test")
    at20 = next(r for r in rows if r["clients"] == 20)
    assert at20["dev_mean"] == pytest.approx(np.mean([dev[20, 0], dev[20, 1]]))
    assert row["drop_20"] == f"{d.mean():.2f} ± {d.std(ddof=1):.2f}"
    at3 = next(r for r in rows if r["clients"] == 3)
    assert at3["test_mean"] == pytest.approx(np.mean([test[3, 0], test[3, 1]]))
    assert at3["dev_mean"] == pytest.approx(np.mean([dev[3, 0], dev[3, 1]]))
    assert result.panels[0].ylabel.endswith(f"FedSA-LoRA: {row['measure']})")


def test_dirichlet_table_states_table_2s_claim_and_prints_no_table_1_figures(
        tmp_path, monkeypatch):
    """sst2_dirichlet runs every method at N = 20 on Dirichlet(0.5) shards. The paper has no
    SST-2 figure for label skew (its Table 2 is MNLI and QQP): the table has no paper column,
    its note states Table 2's claim, not Table 1's, and its title has no centralized run.
    A second note gives each seed's model-free reference: every client answering its shards
    with its most common training label (checked here by counting sentence by sentence)."""
    import collections

    import numpy as np

    from tasks import partition

    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=2, clients=(3, 20))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    (tmp_path / "sst2").mkdir()
    rng = np.random.default_rng(0)
    labels = {split: rng.integers(0, 2, n) for split, n in
              (("train", 400), ("dev", 60), ("test-labeled", 90))}
    for split, y in labels.items():
        (tmp_path / "sst2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"words {i}\t{v}\n" for i, v in enumerate(y)))
    calls = []

    def fake_train(args, what):
        calls.append(args)
        run_dir = pathlib.Path(_value(args, "output_dir"))
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": int(_value(args, "rounds")), "communication_rounds": 1,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": 0.75, "eval_test_accuracy": 0.5}}))

    monkeypatch.setattr(sst2, "run_subprocess", fake_train)
    ctx = running.Context("sst2_dirichlet", "small", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path, methods=None)
    result = sst2.run_sst2_dirichlet(ctx)
    assert {_value(a, "num_clients") for a in calls} == {"20"}
    assert all(_value(a, "partition") == "dirichlet" and _value(a, "dirichlet_alpha") == "0.5"
               for a in calls)
    assert len(calls) == 2 * len(sst2.SST2_CLAIM_METHODS)
    assert "paper" not in [c.key for c in result.table.columns]
    for seed in (0, 1):
        parts = partition.partition(labels["train"], 20, "dirichlet", seed, alpha=0.5)
        scores = []
        for split in ("dev", "test-labeled"):
            shards = partition.split_test_like_train(labels["train"], parts, labels[split], seed)
            correct = 0
            for cid, idx in parts.items():
                counts = collections.Counter(labels["train"][idx].tolist())
                label = min(c for c, k in counts.items() if k == max(counts.values()))
                correct += sum(labels[split][j] == label for j in shards[cid])
            scores.append(correct / len(labels[split]))
        mix = next(n for n in result.table.notes if n.startswith("Without a model"))
        assert f"dev {scores[0]:.4f}, test {scores[1]:.4f} at seed {seed}" in mix
    assert "Table 2" in result.table.notes[0] and "Table 1" not in result.table.notes[0]
    assert "centralized" not in result.table.title
    assert "94.88" not in json.dumps(result.table.rows, default=str)


def test_label_mix_accuracy_cuts_the_shards_the_run_builds(tmp_path):
    """label_mix_accuracy re-cuts the shards from the labels alone. They must be the run's:
    the training split and dev shards of `task.build_task` (what train.py's sst2 task calls)
    and the test shards of `registry._split_like_clients` (train.py --eval_test)."""
    import numpy as np

    from tasks import partition, registry
    from tasks import task as task_lib

    rng = np.random.default_rng(5)
    train, dev, test = (rng.integers(0, 2, n) for n in (300, 50, 70))
    (tmp_path / "sst2").mkdir()
    for split, y in (("train", train), ("dev", dev), ("test-labeled", test)):
        (tmp_path / "sst2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"words {i}\t{v}\n" for i, v in enumerate(y)))
    for seed in (0, 1):
        built = task_lib.build_task("sst2", np.zeros((300, 1)), train, np.zeros((50, 1)), dev, 2,
                                    20, "dirichlet", seed, alpha=0.5)
        parts = partition.partition(train, 20, "dirichlet", seed, alpha=0.5)
        for cid, idx in parts.items():
            np.testing.assert_array_equal(np.sort(built.train_data.client_labels(cid)),
                                          np.sort(train[idx]))
        dev_parts = partition.split_test_like_train(train, parts, dev, seed)
        assert built.info["test_sizes"] == {k: len(v) for k, v in dev_parts.items()}
        for cid in built.test_data.client_ids:
            np.testing.assert_array_equal(np.sort(built.test_data.client_labels(cid)),
                                          np.sort(dev[dev_parts[cid]]))
        test_parts = registry._split_like_clients(built.train_data, test, seed)
        expected_test = partition.split_test_like_train(train, parts, test, seed)
        assert all(np.array_equal(test_parts[k], expected_test[k]) for k in parts)
        assert sst2.label_mix_accuracy(tmp_path / "sst2", 20, 0.5, seed) == (
            partition.majority_label_accuracy(train, parts, dev, dev_parts),
            partition.majority_label_accuracy(train, parts, test, expected_test))


# ------------------------------------------------------------------------------------------------
# Verdicts (issue 51, item 5): paired per-seed differences, Student-t intervals, verdict words.

T_975_1, T_975_2 = 12.706205, 4.302653   # Student's t, 0.975 quantile, 1 and 2 degrees of freedom


def test_t_interval_by_hand():
    """Differences 1, 2, 3: mean 2, s = 1 (ddof = 1), half-width t(0.975, 2)·1/√3 = 2.48414;
    differences 1, 3: mean 2, s = √2, half-width t(0.975, 1)·√2/√2 = 12.706205."""
    from experiments import verdicts

    i = verdicts.t_interval([1.0, 2.0, 3.0])
    assert (i.n, i.mean, i.std) == (3, 2.0, 1.0)
    assert i.low == pytest.approx(2 - T_975_2 / 3 ** 0.5, abs=1e-5)
    assert i.high == pytest.approx(2 + 2.48414, abs=1e-5)
    j = verdicts.t_interval([1.0, 3.0])
    assert j.std == pytest.approx(2 ** 0.5)
    assert (j.low, j.high) == (pytest.approx(2 - T_975_1, abs=1e-5),
                               pytest.approx(2 + T_975_1, abs=1e-5))
    assert verdicts.verdict(verdicts.t_interval([])) == "undecided (0 seeds)"


def _write_summary(folder: pathlib.Path, rounds: int, test: float, dev: float | None = None):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "rounds_completed": rounds, "communication_rounds": rounds,
        "upload_bytes_per_client_total": 0,
        "final": {"eval_accuracy": test if dev is None else dev, "eval_test_accuracy": test}}))


# Hand-set test accuracies (method, N) -> per seed 0, 1, 2 (None: no finished run).
_HAND = {("rolora", 3): (0.85, 0.85, 0.85), ("rolora", 50): (0.84, 0.83, 0.82),
         ("fedavg_lora", 3): (0.84, 0.84, 0.84), ("fedavg_lora", 50): (0.82, 0.80, 0.78),
         ("ffa_lora", 3): (0.86, 0.86, 0.86), ("ffa_lora", 50): (0.86, 0.86, 0.86),
         ("flexlora", 3): (None, None, None), ("flexlora", 50): (0.50, None, None)}


def _hand_archive(folder: pathlib.Path, rounds: dict) -> None:
    """_HAND as archived runs at lr 0.3, in `_sst2_protocol`'s layout."""
    for (method, n), accuracies in _HAND.items():
        for seed, accuracy in enumerate(accuracies):
            if accuracy is not None:
                _write_summary(folder / method / f"N{n}" / f"seed{seed}" / "lr0.3", rounds[n],
                               accuracy)


@pytest.mark.parametrize("methods", [None, ("rolora", "fedavg_lora")])
def test_collect_gives_the_verdicts_of_hand_set_archived_runs(tmp_path, monkeypatch, methods):
    """--collect on archived summaries whose differences are set by hand (points, seeds 0-2):
    (a) drop FedAvg-LoRA − drop RoLoRA = (2 − 1, 4 − 2, 6 − 3) = (1, 2, 3): interval
        2 ± 4.302653/√3 = [−0.484, 4.484] holds 0: not reproduced;
    (b) RoLoRA − FedAvg-LoRA at 50 = (2, 3, 4): 3 ± 2.484 = [0.516, 5.484]: confirmed;
    (c) FFA-LoRA's drop = (0, 0, 0): [0, 0] holds 0: not reproduced;
    (d) FedAvg-LoRA − FlexLoRA − 10 (a collapse: a gap over 10 points) at 50: seed 0 only,
        82 − 50 − 10 = 22: undecided (1 seed); the paper's 93.00 − 54.08 − 10 = 28.92;
    (e) RoLoRA − FFA-LoRA at 50 = (−2, −3, −4): [−5.484, −0.516]: refuted.
    With --methods=rolora,fedavg_lora only (a) and (b) have their cells: the others are left
    out."""
    from experiments import report

    cfg = dict(sst2.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=3, clients=(3, 50),
               grid_every_n=True)
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "small", cfg)
    archive = tmp_path / "archive"
    _hand_archive(archive, {3: 6, 50: 1})   # R_3 = 6, R_50 = max(1, ⌊6·3/50 + ½⌋) = 1
    ctx = running.Context("sst2_clients", "small", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path, collect=True, methods=methods, archive_dir=archive)
    monkeypatch.setattr(sst2, "run_subprocess", lambda *a: pytest.fail("--collect ran a run"))
    rows, _, _ = sst2._sst2_protocol(ctx, ["--partition=iid"], cfg["clients"], False)
    result = sst2._sst2_claim_result(ctx, rows, "IID", claims=sst2._iid_claims(rows))
    table = result.extra_tables["claims"]
    h = T_975_2 / 3 ** 0.5
    expected = {"(a)": (3, 2, 1, 2 - h, 2 + h, 1.93, "not reproduced at this scale"),
                "(b)": (3, 3, 1, 3 - h, 3 + h, 1.80, "confirmed"),
                "(c)": (3, 0, 0, 0, 0, 1.95, "not reproduced at this scale"),
                "(d)": (1, 22, None, None, None, 28.92, "undecided (1 seed)"),
                "(e)": (3, -3, 1, -3 - h, -3 + h, 1.57, "refuted")}
    if methods:
        expected = {k: v for k, v in expected.items() if k in ("(a)", "(b)")}
    got = {r["claim"][:3]: r for r in table.rows}
    assert list(got) == list(expected)
    for label, (n, mean, std, low, high, paper, word) in expected.items():
        r = got[label]
        assert (r["seeds"], r["verdict"], r["paper"]) == (n, word, pytest.approx(paper))
        assert r["mean"] == pytest.approx(mean, abs=1e-9)
        for key, value in (("std", std), ("ci_low", low), ("ci_high", high)):
            assert (r[key] != r[key]) if value is None else r[key] == pytest.approx(value,
                                                                                    abs=1e-5)
    assert got["(a)"]["per_seed"] == "0: +1.00, 1: +2.00, 2: +3.00"
    if not methods:
        assert got["(d)"]["note"] == ("the gap less 10 points: the gap is +32.00 points "
                                      "(paper +38.92)")
    report.write_table(tmp_path / "out", table, "claims")
    with open(tmp_path / "out" / "claims.csv", newline="") as f:
        assert [r["verdict"] for r in csv.DictReader(f)] == [v[-1] for v in expected.values()]
    assert "10 steps" not in table.title and "5 steps × batch 16 = 80 samples" in table.title
    assert "frozen-pooler protocol: BERT's untrained pooler, 32 tokens" in result.table.title


def test_the_dirichlet_claim_from_rows_by_hand():
    """(f) RoLoRA − FedAvg-LoRA at N = 20 under label skew, seeds 0, 1: (81 − 79, 80 − 79) =
    (2, 1): mean 1.5, s = √0.5, half-width 12.706205·√0.5/√2 = 6.3531: not reproduced."""
    from experiments import verdicts

    rows = [dict(key="rolora", clients=20, by_seed={0: 0.81, 1: 0.80}, measure="test"),
            dict(key="fedavg_lora", clients=20, by_seed={0: 0.79, 1: 0.79, 2: 0.7},
                 measure="test")]
    (row,) = verdicts.claim_rows(sst2.table2_claims(20, 0.5), rows)
    assert row["seeds"] == 2 and row["per_seed"] == "0: +2.00, 1: +1.00"
    assert row["mean"] == pytest.approx(1.5) and row["std"] == pytest.approx(0.5 ** 0.5)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(1.5 - T_975_1 / 2, abs=1e-5),
                                               pytest.approx(1.5 + T_975_1 / 2, abs=1e-5))
    assert row["verdict"] == "not reproduced at this scale"
    assert row["claim"].startswith("(f) RoLoRA more accurate than FedAvg-LoRA")


# ------------------------------------------------------------------------------------------------
# sst2_clients_mean and sst2_dirichlet_mean (issue 51, item 6)


def _mean_train(monkeypatch, calls, best=None, errors=None):
    """A train.py whose dev and test accuracy peak at lr `best[method]` (default 0.3), falling
    0.01 per unit of |log lr − log best|; FedAvg-LoRA runs write `errors[seed]` into metrics.csv
    as train/averaging_error (one row per value)."""
    import math

    def fake_train(args, what):
        calls.append([str(a) for a in args])
        run_dir = pathlib.Path(_value(args, "output_dir"))
        method = run_dir.parts[-4]
        seed, lr = int(_value(args, "seed")), float(_value(args, "learning_rate"))
        accuracy = 0.8 - 0.01 * abs(math.log(lr / (best or {}).get(method, 0.3)))
        _write_summary(run_dir, int(_value(args, "rounds")), accuracy)
        values = (errors or {}).get(seed) if method == "fedavg_lora" else None
        lines = ["round,train/averaging_error"] + [f"{i},{v}" for i, v in enumerate(values or ())]
        (run_dir / "metrics.csv").write_text("\n".join(lines if values else ["round"]) + "\n")

    monkeypatch.setattr(sst2, "run_subprocess", fake_train)


def test_sst2_clients_mean_runs_only_its_cells_with_the_corrected_classifier(
        tmp_path, monkeypatch):
    """Full scale: RoLoRA, FedAvg-LoRA, FFA-LoRA at N = 3 and 50, FlexLoRA at 50 only, the
    centralized run; every run passes --pooling=mean --head=linear and no --sequence_length,
    on MiniLM with LoRA on layers 3-5, 10 steps of batch 16, the test split; rounds 500 at
    N = 3 (and centralized), ⌊500·3/50 + ½⌋ = 30 at N = 50. FFA-LoRA's accuracy peaks at 3.0:
    its grid runs 1.0's edge 3.0, then 3.0's edge 10.0, and stops with 3.0 inside."""
    monkeypatch.setitem(sst2.POOLER_ERA_ARCHIVES, "sst2_clients_mean", str(tmp_path / "none"))
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test-labeled.tsv").write_text("sentence\tlabel\n")
    calls = []
    _mean_train(monkeypatch, calls, best={"ffa_lora": 3.0})
    ctx = running.Context("sst2_clients_mean", "full", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path)
    result = sst2.run_sst2_clients_mean(ctx)
    cells = {(_value(a, "output_dir").split("/")[-4], int(_value(a, "num_clients")),
              int(_value(a, "rounds"))) for a in calls}
    assert cells == {(m, 3, 500) for m in ("rolora", "fedavg_lora", "ffa_lora")} | {
        (m, 50, 30) for m in ("rolora", "fedavg_lora", "ffa_lora", "flexlora")} | {
        ("centralized", 1, 500)}
    for args in calls:
        assert "--pooling=mean" in args and "--head=linear" in args and "--eval_test" in args
        assert not any(a.startswith("--sequence_length") for a in args)
        for flag in ("--backbone=minilm", "--lora_layers=3,4,5", "--local_steps=10",
                     "--batch_size=16", "--rank=4", "--lora_targets=query,value"):
            assert flag in args
    ffa = [float(_value(a, "learning_rate")) for a in calls
           if "/ffa_lora/N3/seed0/" in _value(a, "output_dir")]
    assert ffa == [0.1, 0.3, 1.0, 3.0, 10.0]
    # 8 cells: 3 grid rates + 2 more seeds each, FFA-LoRA's two grids 2 edge rates more each.
    assert len(calls) == 8 * 5 + 2 * 2
    assert {(r["key"], r["clients"], r["learning_rate"], r["seeds_done"])
            for r in result.table.rows if r["key"] == "ffa_lora"} == {
        ("ffa_lora", 3, 3.0, "3/3"), ("ffa_lora", 50, 3.0, "3/3")}
    assert "corrected classifier: mean pooling, linear head, whole sentences" in \
        result.table.title
    assert set(result.extra_tables) == {"drops", "claims"}   # no pooler-era archive here


def test_the_averaging_error_column_is_fedavg_loras_mean_over_rounds_then_seeds(
        tmp_path, monkeypatch):
    """sst2_dirichlet_mean runs RoLoRA and FedAvg-LoRA at N = 20 on Dirichlet(0.5) shards with
    the corrected classifier. FedAvg-LoRA's train/averaging_error per round: seed 0 (0.1, 0.3),
    seed 1 (0.2, blank, 0.6), seed 2 (0.6): run means 0.2, 0.4, 0.6, their mean 0.4; RoLoRA's
    runs have no such column: blank."""
    cfg = dict(sst2.SST2_MEAN_SCALES["small"], learning_rates=(0.3,), seeds=3)
    monkeypatch.setitem(sst2.SST2_MEAN_SCALES, "small", cfg)
    monkeypatch.setattr(sst2, "label_mix_accuracy", lambda *a: (0.5, 0.5))
    (tmp_path / "sst2").mkdir()
    (tmp_path / "sst2" / "test-labeled.tsv").write_text("sentence\tlabel\n")
    calls = []
    _mean_train(monkeypatch, calls, errors={0: (0.1, 0.3), 1: (0.2, "", 0.6), 2: (0.6,)})
    ctx = running.Context("sst2_dirichlet_mean", "small", tmp_path / "out", resume=True,
                          seed=0, data_dir=tmp_path)
    result = sst2.run_sst2_dirichlet_mean(ctx)
    assert {(_value(a, "output_dir").split("/")[-4], _value(a, "num_clients"),
             _value(a, "partition"), _value(a, "dirichlet_alpha")) for a in calls} == {
        (m, "20", "dirichlet", "0.5") for m in ("rolora", "fedavg_lora")}
    error = {r["key"]: r["averaging_error"] for r in result.table.rows}
    assert error["fedavg_lora"] == pytest.approx(0.4) and error["rolora"] is None
    assert "averaging_error" in [c.key for c in result.table.columns]
    assert "N = 20: 0.4" in result.extra_tables["claims"].title
    (claim,) = result.extra_tables["claims"].rows
    assert claim["per_seed"] == "0: +0.00, 1: +0.00, 2: +0.00"


def test_the_pooler_era_figures_stand_beside_the_new_cells(tmp_path, monkeypatch):
    """At the full scale the _mean experiment reads the pooler-era archive in place: RoLoRA at
    N = 50 there ended at test 0.80, 0.82, 0.84 (mean 0.82, ddof = 1 std 0.02); the new runs
    at 0.8: 100·(0.80 − 0.82) = −2 points. A cell missing from the archive is blank."""
    old = tmp_path / "old_archive"
    for seed, accuracy in enumerate((0.80, 0.82, 0.84)):
        _write_summary(old / "rolora" / "N50" / f"seed{seed}" / "lr1", 30, accuracy)
    monkeypatch.setitem(sst2.POOLER_ERA_ARCHIVES, "sst2_dirichlet_mean", str(old))
    monkeypatch.setitem(sst2.SST2_CLAIM_SCALES, "full", dict(
        sst2.SST2_CLAIM_SCALES["full"], learning_rates=(1.0,), edge_rates=()))
    new = [dict(key="rolora", clients=50, method="RoLoRA", learning_rate=0.3,
                test_accuracy="0.8000 ± 0.0000", test_mean=0.8, seeds_done="3/3"),
           dict(key="fedavg_lora", clients=50, method="FedAvg-LoRA", learning_rate=0.3,
                test_accuracy=None, test_mean=None, seeds_done="0/3")]
    ctx = running.Context("sst2_dirichlet_mean", "full", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path)
    monkeypatch.setattr(sst2, "run_subprocess", lambda *a: pytest.fail("read only"))
    table = sst2.pooler_era_table(ctx, new, "sst2_dirichlet_mean", ["--partition=iid"], (50,),
                                  False)
    rolora, fedavg = table.rows
    assert (rolora["old_test"], rolora["old_seeds"], rolora["old_lr"]) == (
        "0.8200 ± 0.0200", "3/3", 1.0)
    assert rolora["change"] == pytest.approx(-2.0)
    assert fedavg["old_test"] is None and fedavg["change"] is None
    assert "frozen-pooler protocol: BERT's untrained pooler, 32 tokens" in table.title
    small = dataclasses.replace(ctx, scale="small")
    assert sst2.pooler_era_table(small, new, "sst2_dirichlet_mean", [], (50,), False) is None
