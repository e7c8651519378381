"""experiments/sst2's run order and table, with train.py replaced by a recorder that writes the
summary a finished run would (no training: the order is what is under test)."""

import csv
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
    finished at both, mean ± population std (numpy below), each seed's drop listed; a seed
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
        assert table[name]["drop_20"] == f"{d.mean():.2f} ± {d.std():.2f}"
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
    assert row["drop_20"] == f"{d.mean():.2f} ± {d.std():.2f}"
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
        assert f"dev {scores[0]:.4f}, test {scores[1]:.4f} at seed {seed}" in result.table.notes[1]
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
