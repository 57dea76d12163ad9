PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed

.PHONY: serve test bench migrate clean agents-check

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

# The main suite, then the real-agent checks (below) in their own environment.
test: $(STAMP) $(AGENTS_STAMP)
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory agents-check

# smolagents, LlamaIndex, DSPy and the OpenAI Agents SDK driven through loopwarden, in an environment of
# their own. The Agents SDK goes in last: it wants a newer openai than LlamaIndex declares (which works).
# Those packages leave their HTTP clients open at exit, hence the two warnings ignored here only.
$(AGENTS_STAMP): pyproject.toml setup.py proxy/detect/content.pyx
	test -x $(AGENTS_VENV)/bin/python || $(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install --quiet --upgrade pip
	$(AGENTS_VENV)/bin/pip install --quiet -e '.[dev,agents]'
	$(AGENTS_VENV)/bin/pip install --quiet 'openai-agents>=0.20'
	touch $@

agents-check: $(AGENTS_STAMP)
	$(AGENTS_VENV)/bin/python -m pytest -q tests/agents -W ignore::ResourceWarning \
		-W ignore::pytest.PytestUnraisableExceptionWarning

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/detect.py

clean:
	rm -rf $(VENV) $(AGENTS_VENV) *.egg-info .pytest_cache build proxy/detect/content.c proxy/detect/*.so
