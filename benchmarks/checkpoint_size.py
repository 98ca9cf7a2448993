"""Checkpoint size and write time for SmolLM2-135M: the one-file format (model, optimizer and KL
reference state dicts in one ``state.pt``) against the current layout (``model.safetensors``,
``optimizer.pt``, a small ``state.pt``; the reference is a pointer, written once per run only after
a warm start).

    .venv/bin/python -m benchmarks.checkpoint_size [--dir /tmp]
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path


def main() -> None:
    import torch

    from flowgrpo.modeling.models import load_model
    from flowgrpo.runs.checkpoint import REFERENCE_FILE, save_checkpoint, write_reference
    from flowgrpo.training.optim import adamw
    from flowgrpo.training.trainer import frozen_reference

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--dir", default=tempfile.gettempdir(), help="where to write (needs ~4 GB free)")
    args = ap.parse_args()
    model, _ = load_model("smollm2-135m")
    ref = frozen_reference(model)
    opt = adamw(model, lr=1e-6)
    model(torch.tensor([[1, 2, 3]])).logits.sum().backward()
    opt.step()  # AdamW's moments exist only after a step
    d = Path(tempfile.mkdtemp(dir=args.dir))
    try:
        t0 = time.perf_counter()
        old = {
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "extra": {"ref_model": ref.state_dict()},
        }
        torch.save(old, d / "old_state.pt")
        print(
            f"one-file state.pt: {(d / 'old_state.pt').stat().st_size / 1e9:.3f} GB in {time.perf_counter() - t0:.1f} s"
        )
        t0 = time.perf_counter()
        path = save_checkpoint(d / "ckpt", 1, model=model, optimizer_state=opt.state_dict())
        took = time.perf_counter() - t0
        for f in sorted(path.iterdir()):
            print(f"  {f.name}: {f.stat().st_size / 1e9:.3f} GB")
        total = sum(f.stat().st_size for f in path.iterdir())
        print(f"checkpoint: {total / 1e9:.3f} GB in {took:.1f} s")
        write_reference(d / "ckpt", ref)
        size = (d / "ckpt" / REFERENCE_FILE).stat().st_size
        print(f"reference, once per run after a warm start: {size / 1e9:.3f} GB")
    finally:
        shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    main()
