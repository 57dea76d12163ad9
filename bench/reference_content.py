"""A straightforward implementation of the reference chanting algorithm: the benchmark's baseline.

Written from the published description: per delta, marker checks reset the
tracking, the text is appended, kept to the last 5000 characters (indices
rewritten on truncation), and every new 50-character window is hashed with
SHA-256 and indexed. Its marker regexes are the corrected ones, so the two
detectors can be compared on the cases where they should agree.
"""

from __future__ import annotations

import hashlib
import re

CHUNK = 50
THRESHOLD = 10
MAX_HISTORY = 5000

_TABLE = re.compile(r"(^|\n)\s*(\|.*\||[|+-]{3,})")
_LIST = re.compile(r"(^|\n)\s*([-*+]|\d+\.)\s")
_HEADING = re.compile(r"(^|\n)#+\s")
_QUOTE = re.compile(r"(^|\n)>\s")
_DIVIDER = re.compile(r"^[-+_=*\u2500-\u257F]+$")


class ReferenceContent:
    def __init__(self) -> None:
        self.history = ""
        self.stats: dict[str, list[int]] = {}
        self.last_index = 0
        self.in_code = False

    def reset(self) -> None:
        self.history = ""
        self.stats = {}
        self.last_index = 0

    def add(self, content: str) -> bool:
        fences = content.count("```")
        divider = bool(_DIVIDER.match(content))
        if fences or _TABLE.search(content) or _LIST.search(content) or _HEADING.search(content) \
                or _QUOTE.search(content) or divider:
            self.reset()
        was_in_code = self.in_code
        if fences % 2:
            self.in_code = not self.in_code
        if was_in_code or self.in_code or divider:
            return False
        self.history += content
        self._truncate()
        while self.last_index + CHUNK <= len(self.history):
            chunk = self.history[self.last_index:self.last_index + CHUNK]
            if self._loop_at(chunk, hashlib.sha256(chunk.encode()).hexdigest()):
                return True
            self.last_index += 1
        return False

    def _truncate(self) -> None:
        if len(self.history) <= MAX_HISTORY:
            return
        cut = len(self.history) - MAX_HISTORY
        self.history = self.history[cut:]
        self.last_index = max(0, self.last_index - cut)
        rewritten = {}
        for key, positions in self.stats.items():
            kept = [p - cut for p in positions if p >= cut]
            if kept:
                rewritten[key] = kept
        self.stats = rewritten

    def _loop_at(self, chunk: str, key: str) -> bool:
        positions = self.stats.get(key)
        if positions is None:
            self.stats[key] = [self.last_index]
            return False
        if self.history[positions[0]:positions[0] + CHUNK] != chunk:
            return False
        positions.append(self.last_index)
        if len(positions) < THRESHOLD:
            return False
        recent = positions[-THRESHOLD:]
        if (recent[-1] - recent[0]) / (THRESHOLD - 1) > CHUNK * 5:
            return False
        gaps = {self.history[a:b] for a, b in zip(recent, recent[1:])}
        return len(gaps) <= THRESHOLD // 2
