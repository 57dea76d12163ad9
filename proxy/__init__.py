"""loopwarden: an OpenAI-compatible reverse proxy that stops LLM agents from looping."""

__version__ = "0.1.0"

from proxy import compiled as _compiled  # noqa: E402

_compiled.install()  # before any compiled module is imported: a stale one is run from its source
