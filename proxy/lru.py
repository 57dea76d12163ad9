"""A dict that keeps only its most recently put entries: the bound on every per-session map in memory."""

from __future__ import annotations

from collections import OrderedDict
from typing import Any, Callable, Hashable


class LRU(OrderedDict):
    """At most `size` entries and, where `weigh` is given, at most `budget` bytes as `weigh(key, value)` counts
    them: a value whose size a client chooses (its text, its arguments) is bounded by what it holds, not only by
    how many there are. A value is weighed when put (one changed in place is put again); entries leave by `put`
    only, so `held` stays the sum of the weights of what is there."""

    def __init__(self, size: int, budget: int = 0, weigh: Callable[[Hashable, Any], int] | None = None) -> None:
        super().__init__()
        self.size = size
        self.budget = budget
        self.weigh = weigh
        self.held = 0  # bytes, by the weights
        self._weights: dict = {}

    def put(self, key, value) -> None:
        self[key] = value
        self.move_to_end(key)
        if self.weigh is None:
            if len(self) > self.size:
                self.popitem(last=False)
            return
        weight = self.weigh(key, value)
        self.held += weight - self._weights.get(key, 0)
        self._weights[key] = weight
        while len(self) > self.size or (self.held > self.budget and self):
            self.held -= self._weights.pop(self.popitem(last=False)[0])
