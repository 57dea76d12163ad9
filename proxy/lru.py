"""A dict that keeps only its most recently put entries: the bound on every per-session map in memory."""

from __future__ import annotations

from collections import OrderedDict


class LRU(OrderedDict):
    def __init__(self, size: int) -> None:
        super().__init__()
        self.size = size

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > self.size:
            self.popitem(last=False)
