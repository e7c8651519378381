"""usage: smaps_peak.py PATTERN OUT.json — follow the newest process whose cmdline contains PATTERN
(and not this script); every 0.5 s read /proc/pid/smaps, group Rss by mapping (file path, [heap],
anon), keep the grouping at the highest total Rss, and a timeline of (t, total, anon)."""
import json, os, sys, time, collections
pattern, out = sys.argv[1], sys.argv[2]
def find():
    best = None
    for p in os.listdir("/proc"):
        if not p.isdigit() or int(p) == os.getpid(): continue
        try: cmd = open(f"/proc/{p}/cmdline", "rb").read().replace(b"\0", b" ").decode()
        except OSError: continue
        if pattern in cmd and "smaps_peak" not in cmd and "/bin/sh" not in cmd and "time -v" not in cmd:
            best = p if best is None or int(p) > int(best) else best
    return best
pid = None
while pid is None:
    pid = find(); time.sleep(0.5)
start = time.time(); peak = (0, None); timeline = []
while True:
    try:
        groups = collections.Counter(); name = "anon"
        with open(f"/proc/{pid}/smaps") as f:
            for line in f:
                if line[0] in "0123456789abcdef" and "-" in line.split()[0]:
                    parts = line.split()
                    name = parts[5] if len(parts) > 5 else "anon"
                elif line.startswith("Rss:"):
                    groups[name] += int(line.split()[1])
    except (OSError, ProcessLookupError):
        break
    total = sum(groups.values())
    anon = groups["anon"] + groups.get("[heap]", 0)
    timeline.append((round(time.time() - start, 1), total // 1024, anon // 1024))
    if total > peak[0]:
        peak = (total, dict(groups.most_common(25)), round(time.time() - start, 1))
    time.sleep(0.5)
json.dump({"pid": pid, "peak_mb": peak[0] // 1024, "peak_at": peak[2],
           "peak_groups_mb": {k: v // 1024 for k, v in (peak[1] or {}).items()},
           "timeline": timeline}, open(out, "w"), indent=1)
