"""The request path's pure modules, compiled by Cython at install (`setup.py`) when a compiler is at hand.

A compiled module is loaded only when it was built from the source beside it: each is built with a digest of
its source (`<module>.so.source`), and one whose source has changed since (an edit, a pull) is run from the
source until the next build, never from stale code. `LOOPWARDEN_NO_EXTENSIONS=1` runs them all as Python,
as aiohttp's `AIOHTTP_NO_EXTENSIONS` does for aiohttp.
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.machinery
import importlib.util
import os
import sys

# Each request's verdict and each streamed chunk run through these: pure code, no I/O. (The web server's own
# modules stay Python: compiled, their coroutines cost 15 % more CPU per request, BENCHMARKS.md.)
MODULES = (
    "proxy.conversation", "proxy.inspection", "proxy.lru",
    "proxy.detect.engine", "proxy.detect.normalize", "proxy.detect.speakers", "proxy.detect.steps",
    "proxy.detect.text_steps", "proxy.detect.tools",
    "proxy.wire.dialect", "proxy.wire.chat", "proxy.wire.gemini", "proxy.wire.messages", "proxy.wire.responses",
    "proxy.wire.sse",
)


def source_path(name: str) -> str:
    """A module's source file, relative to the project's root (as setup.py names it)."""
    return name.replace(".", "/") + ".py"


class FreshCompiled:
    """Finds each listed module's compiled form only when it is current; else its source."""

    def __init__(self, enabled: bool) -> None:
        self.enabled = enabled
        self.loaded: dict[str, bool] = {}  # module: whether it runs compiled

    def find_spec(self, name, path=None, target=None):
        if name not in MODULES:
            return None
        spec = importlib.machinery.PathFinder.find_spec(name, path)
        if spec is None or not isinstance(spec.loader, importlib.machinery.ExtensionFileLoader):
            self.loaded[name] = False
            return spec
        source = os.path.join(os.path.dirname(spec.origin), name.rpartition(".")[2] + ".py")
        current = self.enabled and _built_from(spec.origin, source)
        self.loaded[name] = current
        return spec if current else importlib.util.spec_from_file_location(name, source)


def _built_from(compiled: str, source: str) -> bool:
    try:
        with open(compiled + ".source") as built, open(source, "rb") as text:
            return built.read().strip() == hashlib.sha256(text.read()).hexdigest()
    except OSError:
        return False


def describe() -> str:
    """How the request path runs, for `loopwarden config`."""
    for name in MODULES:
        importlib.import_module(name)
    compiled = [name for name, yes in FINDER.loaded.items() if yes]
    if not FINDER.enabled:
        return "plain Python (LOOPWARDEN_NO_EXTENSIONS=1)"
    if len(compiled) == len(MODULES):
        return f"compiled ({len(MODULES)} modules)"
    stale = [name for name in MODULES if FINDER.loaded.get(name) is False]
    return f"compiled {len(compiled)} of {len(MODULES)} modules; plain Python: {', '.join(stale)}"


FINDER = FreshCompiled(os.environ.get("LOOPWARDEN_NO_EXTENSIONS", "") != "1")


def install() -> None:
    if FINDER not in sys.meta_path:
        sys.meta_path.insert(0, FINDER)
