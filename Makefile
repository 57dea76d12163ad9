PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed

.PHONY: serve test bench migrate clean

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The content layer is compiled (Cython), so its source is part of the install too.
$(STAMP): $(BIN)/python pyproject.toml setup.py proxy/detect/content.pyx
	$(BIN)/pip install --quiet -e '.[dev]'
	touch $(STAMP)

serve: $(STAMP)
	$(BIN)/loopwarden serve

migrate: $(STAMP)
	$(BIN)/loopwarden migrate

test: $(STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/detect.py

clean:
	rm -rf $(VENV) *.egg-info .pytest_cache build proxy/detect/content.c proxy/detect/*.so
