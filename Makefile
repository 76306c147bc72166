# Two entry points that do all set-up on a fresh machine:
#   make repro   -> installs into .venv, then runs the pipeline (dvc repro) on the embedded data
#   make test    -> installs into .venv (with test extras), then runs the test suite (what CI runs;
#                   it lists the 25 slowest tests at the end)
# and one for the inner loop: make test-fast runs the tests not marked slow, without lint.
# torch==2.13.0 is installed first so that the CPU build is used (an unpinned torch pulls CUDA).
VENV ?= .venv
BIN := $(VENV)/bin
PYTEST_ARGS ?=

.PHONY: setup repro test test-fast lint bench lm lm-stages dvc-yaml refresh

# The language-model example (docs/models.md): the keys examples/lm/params.yaml
# changes, as DVC overrides (a test keeps the two equal), and dvc-vars.yaml's data_dir, which makes
# examples/lm/dvc.yaml's prepare stage upstream of the pipeline.
LM_SET := -S dvc-vars.yaml:data_dir=examples/lm/data \
	-S data.name=text -S data.path=examples/lm/data/corpus.jsonl -S data.test_fraction=0.1 \
	-S data.tokenizer=examples/lm/data/model -S data.max_length=32 -S batching.batch_size=256 \
	-S batching.epochs=8 -S calibrate.epsilon=8.0 \
	-S 'calibrate.group_sizes=[1,2]' -S calibrate.table_discretization=0.01 -S train.model=hf \
	-S +train.model_options.path=examples/lm/data/model -S train.task=causal-lm -S train.lr=0.02 \
	-S train.optimizer=adamw -S train.lr_schedule=linear -S train.warmup_steps=5 -S verify.model=train

$(BIN)/python:
	python3 -m venv $(VENV)
	$(BIN)/python -m pip install -q --upgrade pip

$(VENV)/.installed: pyproject.toml | $(BIN)/python
	$(BIN)/python -m pip install -q torch==2.13.0
	$(BIN)/python -m pip install -q -e '.[test]'
	touch $@

setup: $(VENV)/.installed

repro: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc repro

# dvc.yaml is generated from lib/dpledger/pipeline/declared.py (what each stage reads) and the imports.
dvc-yaml: setup
	PYTHONPATH=lib $(BIN)/python -m dpledger.pipeline.dvc_yaml --write

# After code changes: rerun every stage whose deps changed and commit dvc.lock and the tracked outputs,
# so that HEAD's outputs are HEAD's (a test runs `dvc status` on a clean copy and fails otherwise).
refresh: dvc-yaml
	PATH="$(abspath $(BIN)):$$PATH" dvc repro
	PATH="$(abspath $(BIN)):$$PATH" dvc repro examples/lm/dvc.yaml
	git add dvc.yaml dvc.lock examples/lm/dvc.lock metrics plots reports
	git diff --cached --quiet || git commit -q -m "Refreshed pipeline outputs (make refresh)"

test: setup lint
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest --durations=25 $(PYTEST_ARGS)

test-fast: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m pytest -m "not slow" $(PYTEST_ARGS)

lint: setup
	$(BIN)/ruff check lib tests benchmarks stages
	$(BIN)/ruff format --check lib tests benchmarks stages

bench: setup
	PATH="$(abspath $(BIN)):$$PATH" $(BIN)/python -m benchmarks.run_all

lm: setup
	PATH="$(abspath $(BIN)):$$PATH" dvc exp run --temp -n lm $(LM_SET)

lm-stages: setup  # the same without DVC: each stage in order with the example's params file
	$(BIN)/python -m stages.prepare --out examples/lm/data
	for stage in calibrate schedule train verify audit report; do \
		$(BIN)/python -m stages.$$stage --params examples/lm/params.yaml || exit 2; done

# The packages the GPU machine lacks (benchmarks/gpu/README.md; the versions this project tests with), as
# cp312 manylinux or pure-Python wheels in the git-ignored .whl/, which travels with the tree;
# benchmarks/gpu/run.sh installs them there with --no-index. dp-accounting needs absl-py, attrs, dm-tree
# (which needs wrapt) and mpmath; opacus needs opt-einsum; attrs and mpmath come with hypothesis and torch.
GPU_WHEELS := pydantic==2.14.4 pydantic-core==2.50.5 annotated-types==0.8.0 typing-inspection==0.4.5 \
	dp-accounting==0.6.0 absl-py==2.5.1 dm-tree==0.1.10 wrapt==2.5.2 PLD_accounting==2.0 \
	opacus==1.6.0 opt-einsum==3.4.0
WHEEL_PLATFORMS := --python-version 3.12 --implementation cp --platform manylinux_2_28_x86_64 \
	--platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64

.PHONY: gpu-wheels gpu-dry-run
gpu-wheels:
	python3 -m pip download -q --no-deps --only-binary=:all: $(WHEEL_PLATFORMS) -d .whl $(GPU_WHEELS)
	@du -sh .whl

gpu-dry-run:
	benchmarks/gpu/run.sh $${OUT:-/tmp/dpledger-gpu-dry} --dry-run
