# The two commands of the README. Both are idempotent: they create/update .venv first.
PY := .venv/bin/python
DEMO_ARGS ?=

.PHONY: demo test test-all test-gpu lint bench env

env:
	@bash scripts/bootstrap.sh

# glibc keeps large tensor buffers instead of returning them to the OS after every step (20-25% faster
# steps on this CPU, measured on TRL and on us alike; see docs/benchmarks.md).
MALLOC_TUNED := GLIBC_TUNABLES=glibc.malloc.mmap_threshold=4294967296:glibc.malloc.trim_threshold=68719476736

demo: env
	$(MALLOC_TUNED) $(PY) -m flowgrpo train examples/calculator_agent.yaml --eval-n 500 --untrained-n 100 $(DEMO_ARGS)

test: env
	$(PY) -m ruff check .
	$(PY) -m pytest -q || { rc=$$?; if [ $$rc -eq 5 ]; then echo 'pytest: no tests collected'; else exit $$rc; fi; }

test-all: env
	$(PY) -m pytest -q -m ""

# The GPU suite (tests marked gpu): one RL step on cuda per training path, eval/export/serve on
# cuda, 2 NCCL ranks when two GPUs are present. Skips cleanly on a machine without CUDA.
test-gpu: env
	$(PY) -m pytest -q -m gpu -rs

lint: env
	$(PY) -m ruff check . && $(PY) -m ruff format --check .
