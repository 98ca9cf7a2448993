import os
import signal

import pytest

# Tests never reach a model hub; the embedded models load from local files only.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def pytest_configure(config):
    """The default suite (``-m 'not slow and not gpu'``) is CPU-only, also on a GPU machine: with
    ``model.device: auto`` a CUDA machine would otherwise run it on the GPU, subprocesses and
    torchrun ranks included. Hiding the GPUs before torch first initialises CUDA keeps it on the
    CPU; ``make test-gpu`` (``-m gpu``) sees them."""
    if "not gpu" in (config.option.markexpr or ""):
        os.environ["CUDA_VISIBLE_DEVICES"] = ""


def pytest_collection_modifyitems(config, items):
    """``gpu`` tests skip cleanly where torch has no CUDA GPU (``make test-gpu`` on a CPU machine
    prints skips, not failures)."""
    import torch

    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason=f"needs a CUDA GPU (torch {torch.__version__} sees none)")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)


@pytest.fixture(autouse=True)
def _cpu_unless_gpu_test(request, monkeypatch):
    """``model.device: auto`` resolves to the CPU in every test not marked ``gpu``, in a run that
    mixes both (``-m ''``) too: the CPU tests' numbers never depend on the machine."""
    if "gpu" not in request.keywords:
        from flowgrpo.modeling import hardware

        monkeypatch.setattr(hardware, "cuda_available", lambda: False)


@pytest.fixture
def one_thread():
    """Tiny matmuls under OpenMP on a shared, loaded 2-core machine spin for ~10x longer than they
    compute; one thread keeps the toy trainer's tests (tests/toy.py) at ~0.3 s per RL step."""
    import torch

    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def signal_handlers_restored():
    """After a stop the trainer leaves "exit at once" SIGINT/SIGTERM handlers for the process's
    wind-down; a test that stops a trainer in-process puts pytest's handlers back."""
    handlers = {s: signal.getsignal(s) for s in (signal.SIGINT, signal.SIGTERM)}
    yield
    for s, h in handlers.items():
        signal.signal(s, h)
