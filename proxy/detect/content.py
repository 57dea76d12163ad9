"""The content layer (chanting): the compiled matcher when it is built, else the plain Python one.

The rule is written out in `proxy/detect/content_rule.py`; `proxy/detect/_content.pyx` is the same rule
compiled (Cython), about twenty times faster on a token stream. Both give the same verdicts (the tests
hold them equal), so the choice only changes speed. The install builds the compiled one when it can (a C
compiler and the Python headers); without them the install still succeeds and this module uses the plain
one. `LOOPWARDEN_NO_EXTENSIONS=1` (every compiled part) or `LOOPWARDEN_PURE_CONTENT=1` (this one alone) uses the
plain one even when the compiled one is built.
"""

from __future__ import annotations

import os

from proxy.detect.content_rule import CLASSIFY_WITHIN, GAP_CHUNKS, Chant
from proxy.detect.content_rule import ContentTracker as PureContentTracker

if os.environ.get("LOOPWARDEN_NO_EXTENSIONS", "") == "1" or \
        os.environ.get("LOOPWARDEN_PURE_CONTENT", "").strip().lower() in ("1", "true", "yes", "on"):
    ContentTracker = PureContentTracker
    COMPILED = False
else:
    try:
        from proxy.detect._content import ContentTracker
    except ImportError:  # not built (no C compiler at install time)
        ContentTracker = PureContentTracker
        COMPILED = False
    else:
        COMPILED = True

__all__ = ["CLASSIFY_WITHIN", "COMPILED", "GAP_CHUNKS", "Chant", "ContentTracker", "PureContentTracker"]
