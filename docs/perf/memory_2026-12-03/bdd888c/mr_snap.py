"""Live bytes by tffl line at chosen snapshots of a memray capture.
usage: mr_snap.py driver.bin [n_points]"""
import collections, sys
from memray import FileReader

PKGS = ("tffl/", "models/", "tasks/", "runner/", "scripts/", "benchmarks/", "experiments/")

def where(rec):
    try:
        stack = rec.stack_trace()
    except Exception:
        stack = []
    for func, fn, line in stack:
        if any(p in fn for p in PKGS) and "site-packages" not in fn:
            return f"{fn.split('/work/meas/')[-1]}:{line} {func}"
    if stack:
        func, fn, line = stack[0]
        return f"[{fn.split('site-packages/')[-1]}:{line} {func}]"
    return f"<thread {rec.thread_name}>"

r = FileReader(sys.argv[1])
snaps = list(r.get_memory_snapshots())
print("snapshots", len(snaps), "duration s", (snaps[-1].time - snaps[0].time) / 1000)
step = max(1, len(snaps) // 60)
for i in range(0, len(snaps), step):
    s = snaps[i]
    print(f"{i:5d} t={(s.time - snaps[0].time)/1000:7.1f}s rss={s.rss/2**20:7.0f} heap={s.heap/2**20:7.0f}")
import os, pickle
cache = sys.argv[1] + ".pkl"
if os.path.exists(cache):
    recs = pickle.load(open(cache, "rb"))
else:
    recs = [(where(x), [(i.allocated_before_snapshot, i.deallocated_before_snapshot, i.n_bytes) for i in x.intervals]) for x in r.get_temporal_allocation_records(merge_threads=False)]
    pickle.dump(recs, open(cache, "wb"))
points = [int(x) for x in sys.argv[2].split(",")] if len(sys.argv) > 2 else []
for p in points:
    live = collections.Counter()
    for w, ivs in recs:
        for a, d, b in ivs:
            if a <= p and (d is None or d > p):
                live[w] += b
    tot = sum(live.values())
    print(f"\n== snapshot {p}: t={(snaps[p].time - snaps[0].time)/1000:.1f}s rss={snaps[p].rss/2**20:.0f} MB, live traced {tot/2**20:.0f} MB")
    for k, b in live.most_common(25):
        print(f"{b/2**20:9.1f} MB  {k}")
