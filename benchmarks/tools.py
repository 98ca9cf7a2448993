"""Per-call latency of the built-in tools, and the sandbox's overhead over a plain subprocess.

Run: python benchmarks/tools.py [--n 20]
Prints median and p95 milliseconds per call for: calculator (simple / symbolic), BM25 search over a
1,000-document corpus, the Python sandbox, and a bare ``python -c`` subprocess (the baseline the
sandbox's overhead is measured against).
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import subprocess
import sys
import time

from flowgrpo.tools.calculator import Calculator
from flowgrpo.tools.code import CodeTool, sandbox_capabilities
from flowgrpo.tools.search import BM25Backend, SearchTool

from flowgrpo.tool import invoke


def measure(fn, n: int) -> tuple[float, float]:
    fn()  # warm up
    ts = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        ts.append((time.perf_counter() - t0) * 1000)
    ts.sort()
    return statistics.median(ts), ts[min(len(ts) - 1, int(0.95 * len(ts)))]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=20)
    n = ap.parse_args().n
    calc = Calculator()
    docs = [
        {
            "id": str(i),
            "title": f"Doc {i}",
            "text": f"Document {i} talks about topic {i % 37} and item {i * 7}.",
        }
        for i in range(1000)
    ]
    search = SearchTool(BM25Backend(docs), k=3)
    code = CodeTool()
    rows = [
        ("calculator 391/4", lambda: asyncio.run(invoke(calc, {"expression": "391/4"}))),
        (
            "calculator sqrt(8)*sin(pi/3)",
            lambda: asyncio.run(invoke(calc, {"expression": "sqrt(8)*sin(pi/3)"})),
        ),
        ("search bm25 (1k docs)", lambda: asyncio.run(invoke(search, {"query": "topic 12 item"}))),
        (
            f"python sandbox ({sandbox_capabilities().mode})",
            lambda: asyncio.run(invoke(code, {"code": "print(1)"})),
        ),
        (
            "plain python -c (baseline)",
            lambda: subprocess.run([sys.executable, "-c", "print(1)"], capture_output=True),
        ),
        (
            "plain python -I -S -c (baseline)",
            lambda: subprocess.run([sys.executable, "-I", "-S", "-c", "print(1)"], capture_output=True),
        ),
    ]
    print(f"{'tool':40} {'median ms':>10} {'p95 ms':>10}   (n={n})")
    for name, fn in rows:
        med, p95 = measure(fn, n)
        print(f"{name:40} {med:10.2f} {p95:10.2f}")


if __name__ == "__main__":
    main()
