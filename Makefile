PYTHON ?= python3
VENV := .venv
BIN := $(VENV)/bin
STAMP := $(VENV)/.installed
SERVE_STAMP := $(VENV)/.serving
AGENTS_VENV := .venv-agents
AGENTS_STAMP := $(AGENTS_VENV)/.installed
CLAUDE_CODE := @anthropic-ai/claude-code@2.1.330
GEMINI_CLI := @google/gemini-cli@0.61.0
# The reasoning-loop checks' clients (tests/agents/test_reasoning_clients.py): the Vercel AI SDK with its
# OpenAI-compatible and Anthropic providers (zod is their peer), OpenCode, Qwen Code and Codex CLI.
AI_SDK := ai@7.0.173 @ai-sdk/openai-compatible@3.0.92 @ai-sdk/anthropic@4.0.105 zod@4.6.7
OPENCODE := opencode-ai@1.18.33
QWEN_CODE := @qwen-code/qwen-code@0.24.4
CODEX := @openai/codex@0.169.0
# Cline's CLI (a compiled binary) and Mastra with the AI SDK's OpenAI provider it was built with (zod 3, in a
# folder of its own: the AI SDK above wants zod 4). tests/agents/test_cline_mastra.py.
CLINE := cline@3.0.65
MASTRA := @mastra/core@0.24.9 @ai-sdk/openai@2.0.131 zod@3.25.76

.PHONY: serve test bench migrate clean agents-check litellm-check agents-frameworks test-tools docs docs-build screenshots

$(BIN)/python:
	$(PYTHON) -m venv $(VENV)
	$(BIN)/pip install --quiet --upgrade pip

# The content layer's matcher and the request path's pure modules (proxy/compiled.py lists them) are compiled
# (Cython) when a C compiler is at hand, so their sources are part of the install too: an edit rebuilds (without
# a compiler the install succeeds and the plain Python runs).
COMPILED_SOURCES := $(shell grep -o '"proxy\.[a-z_.]*"' proxy/compiled.py | tr -d '"' | sed 's|\.|/|g; s|$$|.py|')
$(STAMP): $(BIN)/python pyproject.toml setup.py proxy/detect/_content.pyx proxy/wire/_items.pyx proxy/compiled.py $(COMPILED_SOURCES)
	@echo "installing loopwarden with the test tools, and compiling the request path (one compiler per core)"
	$(BIN)/pip install --progress-bar off -e '.[dev]'
	touch $(STAMP)

# Serving needs no test tools, and only the content matcher compiled (21-25x faster compiled; the rest of the
# request path saves about 20 us of a request's 150-330 us compiled, README "Development"): ready in about a
# minute. A full install (`make test`) serves as it is.
$(SERVE_STAMP): $(BIN)/python pyproject.toml setup.py proxy/detect/_content.pyx proxy/wire/_items.pyx
	@if [ -f $(STAMP) ]; then echo "using the full install"; else \
		echo "installing loopwarden to serve (the content matcher compiled; make test compiles the rest)"; \
		LOOPWARDEN_NO_EXTENSIONS=1 $(BIN)/pip install --progress-bar off -e . || exit 1; fi
	touch $(SERVE_STAMP)

serve: $(SERVE_STAMP)
	@echo "The CLI: .venv/bin/loopwarden sessions | detections | stats | config | replay FILE (--help for all)"
	@echo "The page: http://127.0.0.1:$${LOOPWARDEN_PORT:-8989}/loopwarden/ (from this machine)"
	$(BIN)/loopwarden serve

migrate: $(SERVE_STAMP)
	$(BIN)/loopwarden migrate

# The main suite, then the real-agent checks (below) in their own environment.
test: $(STAMP) $(AGENTS_STAMP) test-tools
	$(BIN)/python -m pytest -q $(PYTEST_ARGS)
	$(MAKE) --no-print-directory agents-check

# The page tests drive Debian's Chromium (Playwright's own browser download is not used) and the forward-proxy
# tests go through Debian's tinyproxy: what is missing is installed, where root and apt-get are at hand.
DEBIAN_TEST_TOOLS := chromium tinyproxy
test-tools:
	@missing="$$(for tool in $(DEBIAN_TEST_TOOLS); do command -v $$tool >/dev/null 2>&1 || echo $$tool; done)"; \
	if [ -n "$$missing" ]; then \
		if [ "$$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then \
			echo "installing Debian's" $$missing "for the tests"; \
			apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq $$missing >/dev/null; \
		else \
			echo $$missing "missing and cannot be installed here (it needs root and apt-get): the tests that" \
				"need it will not run"; \
		fi; \
	fi

# smolagents, LlamaIndex, DSPy, pydantic-ai, Google's ADK, the OpenAI Agents SDK, and Claude Code, Gemini CLI, the
# Vercel AI SDK, OpenCode, Qwen Code and Codex CLI (from npm, pinned here: a new pin reinstalls) driven through
# loopwarden, in an environment of their own. The Agents SDK goes in last: it wants a newer openai than LlamaIndex
# declares (which works). Those packages leave their HTTP clients open at exit, hence the two warnings ignored
# here only. The request path's modules compiled for the main environment (the same source tree) serve this one
# too: they are not built twice.
$(AGENTS_STAMP): pyproject.toml setup.py proxy/detect/_content.pyx proxy/wire/_items.pyx Makefile
	test -x $(AGENTS_VENV)/bin/python || $(PYTHON) -m venv $(AGENTS_VENV)
	$(AGENTS_VENV)/bin/pip install --quiet --upgrade pip
	LOOPWARDEN_NO_EXTENSIONS=1 $(AGENTS_VENV)/bin/pip install --quiet -e '.[dev,agents]'
	$(AGENTS_VENV)/bin/pip install --quiet 'openai-agents>=0.20'
	@if command -v npm >/dev/null 2>&1; then \
		mkdir -p $(AGENTS_VENV)/node && cd $(AGENTS_VENV)/node && \
		npm install --silent --no-audit --no-fund --save-exact $(CLAUDE_CODE) $(GEMINI_CLI) $(AI_SDK) $(OPENCODE) \
			$(QWEN_CODE) $(CODEX) $(CLINE) && \
		mkdir -p ../mastra && cd ../mastra && npm install --silent --no-audit --no-fund --save-exact $(MASTRA); \
	else echo "npm is missing: the checks of the npm clients (Claude Code, Gemini CLI, the AI SDK, OpenCode, Qwen Code," \
		"Codex CLI, Cline, Mastra) will not run (install Node.js and npm)"; fi
	touch $@

agents-check: $(AGENTS_STAMP)
	$(AGENTS_VENV)/bin/python -m pytest -q tests/agents -W ignore::ResourceWarning \
		-W ignore::pytest.PytestUnraisableExceptionWarning

# loopwarden as LiteLLM's guardrail (tests/litellm): LiteLLM's proxy, run from its command line, in an environment
# of its own (about 4 minutes to install, so not part of `make test`; CI runs it). LiteLLM's `proxy` extra pins
# packages the index may not hold (its enterprise and database add-ons at exact versions): its proxy's own
# dependencies are installed by name instead, those two add-ons without theirs.
LITELLM_VENV := .venv-litellm
LITELLM_STAMP := $(LITELLM_VENV)/.installed
LITELLM := litellm==1.109.3
LITELLM_PROXY_DEPS := 'uvicorn>=0.33,<1' 'gunicorn>=23,<24' 'fastapi>=0.136.3,<1' 'starlette>=1.0.1,<2' \
	'backoff>=2.2.1,<3' 'pyyaml>=6.0.3,<7' 'rq>=2.7,<3' 'orjson>=3.11.6,<4' 'hiredis>=3,<4' 'apscheduler>=3.11.2,<4' \
	'fastapi-sso>=0.19,<1' 'pyjwt>=2.13,<3' 'python-multipart>=0.0.27,<1' 'cryptography>=49,<51' 'pynacl>=1.6.2,<2' \
	'websockets>=15.0.1,<16' 'boto3>=1.43.117,<2' 'azure-identity>=1.25.2,<2' 'azure-storage-blob>=12.28,<13' \
	'mcp>=2.3,<3' 'httpx2>=2.10,<3' 'pydantic>=2.12,<3' 'restrictedpython>=8.5,<9' 'rich>=13.9.4,<14' \
	'inquirerpy>=0.3.4,<1' 'tomlkit>=0.13.3,<1' 'polars>=1.38.1,<2' 'soundfile>=0.12.1,<1' 'pyroscope-io>=0.8.16,<1' \
	'expression>=5.6,<6' 'backports-zstd>=1,<2' 'granian>=2.7.4,<3' 'uvloop>=0.22.1,<1'
$(LITELLM_STAMP): pyproject.toml setup.py Makefile
	test -x $(LITELLM_VENV)/bin/python || $(PYTHON) -m venv $(LITELLM_VENV)
	$(LITELLM_VENV)/bin/pip install --quiet --upgrade pip
	LOOPWARDEN_NO_EXTENSIONS=1 $(LITELLM_VENV)/bin/pip install --quiet -e '.[dev]' '$(LITELLM)' $(LITELLM_PROXY_DEPS)
	$(LITELLM_VENV)/bin/pip install --quiet --no-deps 'litellm-enterprise==0.1.82' 'litellm-proxy-extras==0.4.110'
	touch $@

litellm-check: $(LITELLM_STAMP)
	LOOPWARDEN_NO_EXTENSIONS=1 $(LITELLM_VENV)/bin/python -m pytest -q tests/litellm -p no:cacheprovider \
		-W ignore::pytest.PytestDeprecationWarning

# CrewAI and the OpenHands SDK (tests/agents/test_frameworks.py): environments of their own, large (about 1 GB
# and 700 MB) and slow to install (about 5 minutes), so not part of `make test`. OpenHands needs Python 3.12+.
FRAMEWORKS := .venv-frameworks
PYTHON_312 ?= $(shell for p in python3.13 python3.12 $$(ls -d $$HOME/.pyenv/versions/3.1[2-9]*/bin/python3 2>/dev/null); do \
	$$p -c 'import sys; assert sys.version_info >= (3, 12)' 2>/dev/null && echo $$p && break; done)
agents-frameworks: $(AGENTS_STAMP)
	test -x $(FRAMEWORKS)/crewai/bin/python || $(PYTHON) -m venv $(FRAMEWORKS)/crewai
	$(FRAMEWORKS)/crewai/bin/pip install --quiet 'crewai==1.15.30'
	@test -n "$(PYTHON_312)" || { echo "the OpenHands SDK needs Python 3.12 or newer: none found (set PYTHON_312)"; exit 1; }
	test -x $(FRAMEWORKS)/openhands/bin/python || $(PYTHON_312) -m venv $(FRAMEWORKS)/openhands
	$(FRAMEWORKS)/openhands/bin/pip install --quiet 'openhands-sdk==1.58.2' 'openhands-tools==1.58.2'
	$(AGENTS_VENV)/bin/python -m pytest -q tests/agents/test_frameworks.py -W ignore::ResourceWarning

# The documentation (MkDocs with the Material theme, from docs/ and mkdocs.yml), in an environment of its own:
# serving and testing never need it. Its generated pages (the settings, each command's --help, the log's schema)
# import the package, which runs here as plain Python.
DOCS_VENV := .venv-docs
DOCS_STAMP := $(DOCS_VENV)/.installed
$(DOCS_STAMP): pyproject.toml setup.py
	test -x $(DOCS_VENV)/bin/python || $(PYTHON) -m venv $(DOCS_VENV)
	$(DOCS_VENV)/bin/pip install --quiet --upgrade pip
	LOOPWARDEN_NO_EXTENSIONS=1 $(DOCS_VENV)/bin/pip install --quiet -e '.[docs]'
	touch $@

# Served at http://127.0.0.1:8000/ (LOOPWARDEN_DOCS_PORT to choose), rebuilt on each edit.
docs: $(DOCS_STAMP)
	LOOPWARDEN_NO_EXTENSIONS=1 NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs serve --dev-addr 127.0.0.1:$${LOOPWARDEN_DOCS_PORT:-8000}

# Built into site/; --strict: a broken link, a page left out of the navigation or a missing file fails it.
docs-build: $(DOCS_STAMP)
	LOOPWARDEN_NO_EXTENSIONS=1 NO_MKDOCS_2_WARNING=1 $(DOCS_VENV)/bin/mkdocs build --strict --site-dir site

# The documentation's pictures of the page (docs/overview.png, docs/sessions.png), taken by the page's tests from
# the log they seed.
screenshots: $(STAMP) test-tools
	LOOPWARDEN_SCREENSHOTS=docs $(BIN)/python -m pytest -q tests/test_page_sessions.py

bench: $(STAMP)
	$(BIN)/python bench/overhead.py
	$(BIN)/python bench/detect.py

clean:
	rm -rf $(VENV) $(AGENTS_VENV) $(LITELLM_VENV) $(FRAMEWORKS) $(DOCS_VENV) site *.egg-info .pytest_cache build
	find proxy -name '*.so' -o -name '*.so.source' -o -name '*.c' | xargs rm -f
