"""The default suite's targets (`benchmarks.config`) and the benchmark's tables and files."""

from __future__ import annotations

import json
import pathlib

from benchmarks.config import GOAL_OVERHEAD, TARGET_MEMORY_RATIO, TARGET_OVERHEAD, BenchmarkConfig


def _mb(n: int | float | None) -> float:
    return float("nan") if n is None else n / 2**20


def evaluate_targets(rows: list[dict], config: BenchmarkConfig) -> dict:
    """Status against the targets, from the rows that bear on each."""
    out: dict = {}
    overhead = [r for r in rows if r["backbone"] == "small" and r["clients_per_round"] == 10
                and r["local_steps"] == 20]
    out["overhead"] = {
        "target": TARGET_OVERHEAD, "goal": GOAL_OVERHEAD,
        "measured": {r["algorithm"]: round(r["overhead_ratio"], 3) for r in overhead},
        "status": ("not measured (needs --backbones=small --clients_per_round=10 "
                   "--local_steps=20)" if not overhead else
                   "met" if all(r["overhead_ratio"] <= TARGET_OVERHEAD for r in overhead)
                   else "not met"),
    }
    scaling, memory = {}, {}
    for (b, a) in sorted({(r["backbone"], r["algorithm"]) for r in rows}):
        group = sorted((r for r in rows if (r["backbone"], r["algorithm"]) == (b, a)),
                       key=lambda r: r["clients_per_round"])
        if len(group) < 2:
            continue
        lo, hi = group[0], group[-1]
        growth = hi["clients_per_round"] / lo["clients_per_round"]
        time_ratio = hi["tff_seconds_per_round"] / lo["tff_seconds_per_round"]
        scaling[f"{b}/{a}"] = {
            "clients": [lo["clients_per_round"], hi["clients_per_round"]],
            "time_ratio": round(time_ratio, 3), "clients_ratio": growth,
            # "at most linear": per-client time does not grow (10% allowance for noise).
            "at_most_linear": time_ratio <= 1.1 * growth,
        }
        mem = {}
        for key in ("total", "worker"):
            a_lo, a_hi = lo["tff_peak_rss_bytes"].get(key), hi["tff_peak_rss_bytes"].get(key)
            if a_lo and a_hi:
                mem[key] = round(a_hi / a_lo, 3)
        memory[f"{b}/{a}"] = {"clients": [lo["clients_per_round"], hi["clients_per_round"]],
                              "peak_ratio": mem,
                              "within_target": mem.get("total", float("inf"))
                              <= TARGET_MEMORY_RATIO}
    out["linear_scaling"] = scaling
    out["memory"] = memory
    out["memory_target"] = ("not measured (needs --clients_per_round=10,...,200)"
                            if not any(set(v["clients"]) == {10, 200} for v in memory.values())
                            else "met" if all(v["within_target"] for v in memory.values()
                                              if set(v["clients"]) == {10, 200}) else "not met")
    retraces = {f"{r['backbone']}/{r['algorithm']}/{r['clients_per_round']}": {
        "tff": r["tff_retraces_after_round2"],
        **{k[:-len("_retraces_after_round2")]: v for k, v in r.items()
           if k.endswith("_retraces_after_round2") and not k.startswith("tff")}}
        for r in rows}
    out["no_retracing_after_round2"] = {
        "status": ("not measured (needs --rounds >= 3)" if config.rounds < 3 else
                   "met" if all(v == 0 for d in retraces.values() for v in d.values())
                   else "not met"),
        "retraces": retraces}
    return out


def format_table(result: dict) -> str:
    rows = result["rows"]
    xla = any("plain_xla_seconds_per_round" in r for r in rows)
    head = ["backbone", "algorithm", "n", "TFF s/rnd", "plain s/rnd", "overhead", "CPU ratio",
            "state I/O s", "TFF r1 s", "plain r1 s"]
    if xla:
        head += ["XLA s/rnd", "XLA gain"]
    cached = any("feature_cache_speedup" in r for r in rows)
    if cached:
        head += ["head uncached s/rnd", "head cache gain"]
    head += ["down B/cl", "up B/cl", "TFF peak MB", "(worker)", "plain MB", "retraces"]
    lines = []
    for r in rows:
        cells = [r["backbone"], r["algorithm"], str(r["clients_per_round"]),
                 f"{r['tff_seconds_per_round']:.2f}", f"{r['plain_seconds_per_round']:.2f}",
                 f"{r['overhead_ratio']:.2f}", f"{r['cpu_overhead_ratio']:.2f}",
                 f"{r['tff_state_round_trip_seconds']:.2f}", f"{r['tff_round1_seconds']:.2f}",
                 f"{r['plain_round1_seconds']:.2f}"]
        if xla:
            cells += [f"{r['plain_xla_seconds_per_round']:.2f}", f"{r['xla_speedup']:.2f}"]
        if cached:
            cells += ([f"{r['plain_nocache_seconds_per_round']:.2f}",
                       f"{r['feature_cache_speedup']:.2f}"]
                      if "feature_cache_speedup" in r else ["", ""])
        peak = r["tff_peak_rss_bytes"]
        retr = f"{r['tff_retraces_after_round2']}/{r['plain_retraces_after_round2']}"
        if xla:
            retr += f"/{r['plain_xla_retraces_after_round2']}"
        cells += [f"{r['bytes_down_per_client']:,}", f"{r['bytes_up_per_client']:,}",
                  f"{_mb(peak.get('total')):.0f}",
                  f"{_mb(max(peak.get('worker', 0), peak.get('worker_hwm', 0))):.0f}",
                  f"{_mb(r['plain_peak_rss_bytes'].get('python')):.0f}", retr]
        lines.append(cells)
    widths = [max(len(h), *(len(c[i]) for c in lines)) for i, h in enumerate(head)]

    def fmt(cells):
        return "| " + " | ".join(c.rjust(w) if i > 1 else c.ljust(w)
                                 for i, (c, w) in enumerate(zip(cells, widths))) + " |"

    out = [fmt(head), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    out += [fmt(c) for c in lines]
    return "\n".join(out)


def format_targets(result: dict) -> str:
    t = result["targets"]
    lines = []
    o = t["overhead"]
    lines.append(f"TFF overhead ratio <= {o['target']} (small BERT, 10 clients x 20 steps): "
                 f"{o['status']}" + (f" {o['measured']}" if o["measured"] else ""))
    if o["measured"]:
        lines.append(f"  goal <= {o['goal']}: "
                     + ("met" if all(v <= o["goal"] for v in o["measured"].values())
                        else "not met"))
    for key, s in t["linear_scaling"].items():
        lines.append(f"scaling {key}: n {s['clients'][0]}->{s['clients'][1]} (x"
                     f"{s['clients_ratio']:g}), TFF time x{s['time_ratio']:.2f} "
                     f"({'at most linear' if s['at_most_linear'] else 'SUPERLINEAR'}); peak RSS "
                     + ", ".join(f"{k} x{v:.2f}" for k, v in
                                 t["memory"][key]["peak_ratio"].items()))
    lines.append(f"peak memory at 200 clients <= {TARGET_MEMORY_RATIO} x at 10: "
                 f"{t['memory_target']}")
    lines.append(f"no retracing after round 2: {t['no_retracing_after_round2']['status']}")
    return "\n".join(lines)


def write_outputs(output_dir: pathlib.Path, result: dict, table: str, targets: str,
                  command: str) -> None:
    result = dict(result, command=command)
    (output_dir / "benchmark.json").write_text(json.dumps(result, indent=1, default=float) + "\n")
    (output_dir / "benchmark.md").write_text(
        f"# tffl benchmark\n\n`{command}`\n\n{table}\n\n```\n{targets}\n```\n")
