"""Full stacks of the biggest records live at snapshot P whose tffl line matches any of KEYS."""
import sys, collections
sys.path.insert(0, "/work/memtools")
from memray import FileReader
PKGS = ("tffl/", "models/", "tasks/", "runner/", "scripts/", "benchmarks/", "experiments/")
path, p, keys = sys.argv[1], int(sys.argv[2]), sys.argv[3].split(",")
r = FileReader(path)
agg = collections.Counter(); stacks = {}
for rec in r.get_temporal_allocation_records(merge_threads=False):
    live = sum(iv.n_bytes for iv in rec.intervals if iv.allocated_before_snapshot <= p and (iv.deallocated_before_snapshot is None or iv.deallocated_before_snapshot > p))
    if not live:
        continue
    try:
        st = rec.stack_trace()
    except Exception:
        continue
    text = [f"{fn.split('site-packages/')[-1].split('/work/meas/')[-1]}:{ln} {f}" for f, fn, ln in st]
    if any(k in t for k in keys for t in text):
        sig = tuple(text[:40])
        agg[sig] += live
for sig, b in agg.most_common(12):
    print(f"\n### {b/2**20:.1f} MB")
    print("\n".join(sig))
