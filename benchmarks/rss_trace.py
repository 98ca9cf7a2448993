"""The resident memory of a command over time: where in a run the memory goes, not only its peak.

    python -m benchmarks.rss_trace --out trace.tsv -- flowgrpo train examples/search_agent.yaml \\
        --eval-n 0 --untrained-n 0 --set model.name=WARM_DIR --set sft.enabled=false --set sft.replay_coef=0 \\
        --set train.steps=4

Runs the command after ``--`` and samples the resident size of its whole process tree (the
command and every descendant, from ``/proc``) every ``--every`` seconds. ``--out`` writes one
``HH:MM:SS<TAB>GB`` line per sample, to line up with the run's log timestamps; the summary prints
the peak and the largest sample of each ``--window`` seconds. A peak (``ru_maxrss``, as
:mod:`benchmarks.learning_matrix` records) says how much; the trace says whether the size climbs
from step to step (docs/learning.md 10.6: 5.3 → 19.2 GB over four steps of the search recipe in
default numerics, and 13.8 GB with the trainer's heap trimming). Linux only.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path


def tree_rss_bytes(pid: int) -> int:
    """Resident bytes of ``pid`` and all its descendants (0 for a process that has exited)."""
    total, todo = 0, [pid]
    while todo:
        p = todo.pop()
        try:
            for line in Path(f"/proc/{p}/status").read_text().splitlines():
                if line.startswith("VmRSS:"):
                    total += int(line.split()[1]) * 1024
            for task in Path(f"/proc/{p}/task").iterdir():
                todo += [int(c) for c in (task / "children").read_text().split()]
        except (OSError, ValueError):
            continue
    return total


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--every", type=float, default=0.5, help="seconds between samples")
    ap.add_argument("--window", type=float, default=30.0, help="seconds per line of the summary")
    ap.add_argument("--out", type=Path, help="write every sample as HH:MM:SS<TAB>GB")
    ap.add_argument("command", nargs=argparse.REMAINDER, help="-- then the command to run")
    args = ap.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        ap.error("give the command to trace after --, e.g. -- flowgrpo train CONFIG")
    if not Path("/proc/self/status").exists():
        ap.error("rss_trace reads /proc: Linux only")
    samples: list[tuple[float, str, int]] = []
    t0 = time.monotonic()
    child = subprocess.Popen(command)
    out = args.out.open("w") if args.out else None
    try:
        while child.poll() is None:
            rss = tree_rss_bytes(child.pid)
            stamp = time.strftime("%H:%M:%S")
            samples.append((time.monotonic() - t0, stamp, rss))
            if out:
                out.write(f"{stamp}\t{rss / 1e9:.2f}\n")
                out.flush()
            time.sleep(args.every)
    finally:
        if out:
            out.close()
    if not samples:
        print(f"exit {child.returncode}: the command ended before the first sample")
        return child.returncode
    windows: dict[int, tuple[str, int]] = {}
    for t, stamp, rss in samples:
        k = int(t // args.window)
        if k not in windows or rss > windows[k][1]:
            windows[k] = (stamp, rss)
    print(f"| window ({args.window:.0f} s) | largest sample | resident GB |")
    print("|---|---|---|")
    for k, (stamp, rss) in sorted(windows.items()):
        print(f"| {k * args.window:.0f}-{(k + 1) * args.window:.0f} s | {stamp} | {rss / 1e9:.2f} |")
    peak = max(rss for _, _, rss in samples)
    print(f"exit {child.returncode}, {len(samples)} samples, peak {peak / 1e9:.2f} GB")
    return child.returncode


if __name__ == "__main__":
    sys.exit(main())
