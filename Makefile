# make setup: create .venv with the whole stack (first run builds Horovod: several minutes)
# make demo:  set up, then train a small CNN on 2 Horovod ranks and report throughput
# make test:  set up, then run the test suite
VENV := .venv
PY := $(VENV)/bin/python

.PHONY: setup demo test

setup:
	bash scripts/setup.sh

demo: setup
	$(VENV)/bin/horovodrun -np 2 -H localhost:2 --gloo \
	  $(PY) examples/pytorch_synthetic_benchmark.py --model cnn --batch-size 32 \
	  --num-warmup 5 --num-batches-per-iter 10 --num-iters 5

test: setup
	$(PY) -m pytest -q -p no:cacheprovider --durations=15
