"""loopwarden: an OpenAI-compatible reverse proxy that stops LLM agents from looping."""

__version__ = "0.1.0"
