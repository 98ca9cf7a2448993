"""Is resume bit-exact at these settings? The test suite's tiny trainer (tests/toy.py's
``make_trainer``) runs 3 RL steps straight through, and again as 1 step, a new process-level
trainer resumed from its checkpoint, 2 more steps; prints whether the final parameters match.

    python benchmarks/exact_resume.py THREADS {static,continuous}
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from tests.toy import make_trainer, params


def main(threads: int, scheduling: str) -> None:
    torch.set_num_threads(threads)
    tmp = Path(tempfile.mkdtemp())
    common = (f"rollout.scheduling={scheduling}", "train.steps=3", "run.save_every=1")
    t0 = time.monotonic()
    straight = make_trainer(tmp, *common, name="straight")
    straight.train()
    wall = time.monotonic() - t0
    first = make_trainer(tmp, *common, name="split")
    first.train(until_step=1)
    del first
    resumed = make_trainer(tmp, *common, "run.resume=true", name="split")
    resumed.train()
    a, b = params(straight.model), params(resumed.model)
    same = all(torch.equal(a[k], b[k]) for k in a)
    diff = max((a[k] - b[k]).abs().max().item() for k in a)
    print(f"threads={threads} scheduling={scheduling}: bit-identical={same} max|diff|={diff:.3g} "
          f"straight 3 steps {wall:.1f} s")  # fmt: skip


if __name__ == "__main__":
    main(int(sys.argv[1]), sys.argv[2])
