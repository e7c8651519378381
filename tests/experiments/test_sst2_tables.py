"""experiments/sst2_tables: the drops, the SST-2 tables' notes and the paper's claims as
verdicts, from runs replaced by a recorder of their RunConfigs that writes the summary a
finished run would, or from hand-set archived summaries."""

import csv
import json
import pathlib

import pytest

from experiments import sst2, sst2_protocol, sst2_tables
from runner import running


def _value(config, flag):
    """The run's field `flag` as its command-line text (lists comma-separated)."""
    value = config.get(flag)
    return ",".join(map(str, value)) if isinstance(value, tuple) else str(value)


def _write_summary(folder: pathlib.Path, rounds: int, test: float, dev: float | None = None):
    folder.mkdir(parents=True)
    (folder / "summary.json").write_text(json.dumps({
        "rounds_completed": rounds, "communication_rounds": rounds,
        "upload_bytes_per_client_total": 0,
        "final": {"eval_accuracy": test if dev is None else dev, "eval_test_accuracy": test}}))


def _protocol_with_finals(tmp_path, monkeypatch, cfg, final_of, methods):
    """Runs `sst2_protocol.run_protocol` at `cfg` with every train.py run replaced by a summary.json
    whose "final" is `final_of(method, N, seed)` (None: a stopped run, no summary); returns its
    rows, its result and the drops table (drops.csv) by method."""
    from runner import report

    def fake_train(config, what, isolate=False):
        run_dir = pathlib.Path(_value(config, "output_dir"))
        method, n, seed = run_dir.relative_to(tmp_path).parts[:3]
        final = final_of(method, int(n[1:]), int(seed[4:]))
        if final is None:
            return
        rerun = final.pop("rerun", None)   # a rerun recorded by archive.attach_rerun
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": int(_value(config, "rounds")), "communication_rounds": 1,
            "upload_bytes_per_client_total": 0, "final": final,
            **({"rerun": {"final": rerun}} if rerun else {})}))

    monkeypatch.setattr(sst2_protocol, "run_training", fake_train)
    ctx = running.Context("sst2_clients", "small", tmp_path, resume=True, seed=0,
                          data_dir=tmp_path, methods=methods)
    rows, _, _ = sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"],
                                     "centralized" in methods)
    result = sst2_tables.claim_result(ctx, rows, "IID")
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
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=3, clients=(3, 20))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
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
    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=2, clients=(3, 20))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
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

    from tasks import partition, partition_schemes

    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=2, clients=(3, 20))
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    (tmp_path / "sst2").mkdir()
    rng = np.random.default_rng(0)
    labels = {split: rng.integers(0, 2, n) for split, n in
              (("train", 400), ("dev", 60), ("test-labeled", 90))}
    for split, y in labels.items():
        (tmp_path / "sst2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"words {i}\t{v}\n" for i, v in enumerate(y)))
    calls = []

    def fake_train(config, what, isolate=False):
        calls.append(config)
        run_dir = pathlib.Path(_value(config, "output_dir"))
        run_dir.mkdir(parents=True)
        (run_dir / "summary.json").write_text(json.dumps({
            "rounds_completed": int(_value(config, "rounds")), "communication_rounds": 1,
            "upload_bytes_per_client_total": 0,
            "final": {"eval_accuracy": 0.75, "eval_test_accuracy": 0.5}}))

    monkeypatch.setattr(sst2_protocol, "run_training", fake_train)
    ctx = running.Context("sst2_dirichlet", "small", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path, methods=None)
    result = sst2.run_sst2_dirichlet(ctx)
    assert {_value(a, "num_clients") for a in calls} == {"20"}
    assert all(_value(a, "partition") == "dirichlet" and _value(a, "dirichlet_alpha") == "0.5"
               for a in calls)
    assert len(calls) == 2 * len(sst2_protocol.SST2_CLAIM_METHODS)
    assert "paper" not in [c.key for c in result.table.columns]
    for seed in (0, 1):
        parts = partition_schemes.partition(labels["train"], 20, "dirichlet", seed, alpha=0.5)
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
    and the test shards of `run_task.split_like_clients` (train.py --eval_test)."""
    import numpy as np

    from tasks import partition, partition_schemes, run_task
    from tasks import task as task_lib

    rng = np.random.default_rng(5)
    train, dev, test = (rng.integers(0, 2, n) for n in (300, 50, 70))
    (tmp_path / "sst2").mkdir()
    for split, y in (("train", train), ("dev", dev), ("test-labeled", test)):
        (tmp_path / "sst2" / f"{split}.tsv").write_text(
            "sentence\tlabel\n" + "".join(f"words {i}\t{v}\n" for i, v in enumerate(y)))
    for seed in (0, 1):
        built = task_lib.build_task(
            "sst2", task_lib.Examples(np.zeros((300, 1)), train),
            task_lib.Examples(np.zeros((50, 1)), dev),
            task_lib.Partitioning(2, 20, "dirichlet", seed, options={"alpha": 0.5}))
        parts = partition_schemes.partition(train, 20, "dirichlet", seed, alpha=0.5)
        for cid, idx in parts.items():
            np.testing.assert_array_equal(np.sort(built.train_data.client_labels(cid)),
                                          np.sort(train[idx]))
        dev_parts = partition.split_test_like_train(train, parts, dev, seed)
        assert built.info["test_sizes"] == {k: len(v) for k, v in dev_parts.items()}
        for cid in built.test_data.client_ids:
            np.testing.assert_array_equal(np.sort(built.test_data.client_labels(cid)),
                                          np.sort(dev[dev_parts[cid]]))
        test_parts = run_task.split_like_clients(built.train_data, test, seed)
        expected_test = partition.split_test_like_train(train, parts, test, seed)
        assert all(np.array_equal(test_parts[k], expected_test[k]) for k in parts)
        assert sst2.label_mix_accuracy(tmp_path / "sst2", 20, 0.5, seed) == (
            partition.majority_label_accuracy(train, parts, dev, dev_parts),
            partition.majority_label_accuracy(train, parts, test, expected_test))


# ------------------------------------------------------------------------------------------------
# Verdicts: paired per-seed differences, Student-t intervals, verdict words.

T_975_1, T_975_2 = 12.706205, 4.302653   # Student's t, 0.975 quantile, 1 and 2 degrees of freedom


def test_t_interval_by_hand():
    """Differences 1, 2, 3: mean 2, s = 1 (ddof = 1), half-width t(0.975, 2)·1/√3 = 2.48414;
    differences 1, 3: mean 2, s = √2, half-width t(0.975, 1)·√2/√2 = 12.706205."""
    from runner import verdicts

    i = verdicts.t_interval([1.0, 2.0, 3.0])
    assert (i.n, i.mean, i.std) == (3, 2.0, 1.0)
    assert i.low == pytest.approx(2 - T_975_2 / 3 ** 0.5, abs=1e-5)
    assert i.high == pytest.approx(2 + 2.48414, abs=1e-5)
    j = verdicts.t_interval([1.0, 3.0])
    assert j.std == pytest.approx(2 ** 0.5)
    assert (j.low, j.high) == (pytest.approx(2 - T_975_1, abs=1e-5),
                               pytest.approx(2 + T_975_1, abs=1e-5))
    assert verdicts.verdict(verdicts.t_interval([])) == "undecided (0 seeds)"


# Hand-set test accuracies (method, N) -> per seed 0, 1, 2 (None: no finished run).
_HAND = {("rolora", 3): (0.85, 0.85, 0.85), ("rolora", 50): (0.84, 0.83, 0.82),
         ("fedavg_lora", 3): (0.84, 0.84, 0.84), ("fedavg_lora", 50): (0.82, 0.80, 0.78),
         ("ffa_lora", 3): (0.86, 0.86, 0.86), ("ffa_lora", 50): (0.86, 0.86, 0.86),
         ("flexlora", 3): (None, None, None), ("flexlora", 50): (0.50, None, None)}


def _hand_archive(folder: pathlib.Path, rounds: dict) -> None:
    """_HAND as archived runs at lr 0.3, in `sst2_protocol.run_protocol`'s layout."""
    for (method, n), accuracies in _HAND.items():
        for seed, accuracy in enumerate(accuracies):
            if accuracy is not None:
                _write_summary(folder / method / f"N{n}" / f"seed{seed}" / "lr0.3", rounds[n],
                               accuracy)


@pytest.mark.parametrize("methods", [None, ("rolora", "fedavg_lora")])
def test_collect_gives_the_verdicts_of_hand_set_archived_runs(tmp_path, monkeypatch, methods):
    """--collect on archived summaries whose differences are set by hand (points, seeds 0-2):
    (a) drop FedAvg-LoRA − drop RoLoRA = (2 − 1, 4 − 2, 6 − 3) = (1, 2, 3): interval
        2 ± 4.302653/√3 = [−0.484, 4.484] holds 0 and the paper's 1.93: inconclusive;
    (b) RoLoRA − FedAvg-LoRA at 50 = (2, 3, 4): 3 ± 2.484 = [0.516, 5.484]: reproduced;
    (c) FFA-LoRA's drop = (0, 0, 0): [0, 0] holds 0, below the paper's 1.95: smaller than
        the paper's effect, at most +0.00;
    (d) FedAvg-LoRA − FlexLoRA − 10 (a collapse: a gap over 10 points) at 50: seed 0 only,
        82 − 50 − 10 = 22: undecided (1 seed); the paper's 93.00 − 54.08 − 10 = 28.92;
    (e) RoLoRA − FFA-LoRA at 50 = (−2, −3, −4): [−5.484, −0.516]: opposite.
    With --methods=rolora,fedavg_lora only (a) and (b) have their cells: the others are left
    out."""
    from runner import report

    cfg = dict(sst2_protocol.SST2_CLAIM_SCALES["small"], learning_rates=(0.3,), seeds=3, clients=(3, 50),
               grid_every_n=True)
    monkeypatch.setitem(sst2_protocol.SST2_CLAIM_SCALES, "small", cfg)
    archive = tmp_path / "archive"
    _hand_archive(archive, {3: 6, 50: 1})   # R_3 = 6, R_50 = max(1, ⌊6·3/50 + ½⌋) = 1
    ctx = running.Context("sst2_clients", "small", tmp_path / "out", resume=True, seed=0,
                          data_dir=tmp_path, collect=True, methods=methods, archive_dir=archive)
    monkeypatch.setattr(sst2_protocol, "run_training",
                        lambda *a: pytest.fail("--collect ran a run"))
    rows, _, _ = sst2_protocol.run_protocol(ctx, {"partition": "iid"}, cfg["clients"], False)
    result = sst2_tables.claim_result(ctx, rows, "IID", claims=sst2_tables.iid_claims(rows))
    table = result.extra_tables["claims"]
    h = T_975_2 / 3 ** 0.5
    expected = {"(a)": (3, 2, 1, 2 - h, 2 + h, 1.93, "inconclusive at this scale"),
                "(b)": (3, 3, 1, 3 - h, 3 + h, 1.80, "reproduced at this scale"),
                "(c)": (3, 0, 0, 0, 0, 1.95, "smaller than the paper's effect at this scale, "
                                             "at most +0.00 points"),
                "(d)": (1, 22, None, None, None, 28.92, "undecided (1 seed)"),
                "(e)": (3, -3, 1, -3 - h, -3 + h, 1.57, "opposite at this scale")}
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
    (2, 1): mean 1.5, s = √0.5, half-width 12.706205·√0.5/√2 = 6.3531: the interval holds 0
    and the paper's effect weighed (+1.41, its MNLI difference): inconclusive."""
    from runner import verdicts

    rows = [dict(key="rolora", clients=20, by_seed={0: 0.81, 1: 0.80}, measure="test"),
            dict(key="fedavg_lora", clients=20, by_seed={0: 0.79, 1: 0.79, 2: 0.7},
                 measure="test")]
    (row,) = verdicts.claim_rows(sst2_tables.table2_claims(20, 0.5), rows)
    assert row["seeds"] == 2 and row["per_seed"] == "0: +2.00, 1: +1.00"
    assert row["mean"] == pytest.approx(1.5) and row["std"] == pytest.approx(0.5 ** 0.5)
    assert (row["ci_low"], row["ci_high"]) == (pytest.approx(1.5 - T_975_1 / 2, abs=1e-5),
                                               pytest.approx(1.5 + T_975_1 / 2, abs=1e-5))
    assert row["verdict"] == "inconclusive at this scale"
    assert row["claim"].startswith("(f) RoLoRA more accurate than FedAvg-LoRA")
