"""Size-bounded LRU caches: served results (keyed by the exact input and options) and tokenized inputs.

Hand-written (an OrderedDict): functools.lru_cache memoises a function, not a shared map with hit
counts that two call sites fill, and this is a dozen lines. Each cache is used from one thread only
(results: the event loop; tokens: the batch worker), so it takes no lock.
"""

from __future__ import annotations

import json
from collections import OrderedDict
from typing import Any

MISSING = object()


class LRUCache:
    def __init__(self, capacity: int):
        self.capacity = max(0, int(capacity))
        self._items: OrderedDict = OrderedDict()
        self.hits = 0
        self.misses = 0

    def get(self, key) -> Any:
        if not self.capacity:
            return MISSING
        value = self._items.get(key, MISSING)
        if value is MISSING:
            self.misses += 1
        else:
            self.hits += 1
            self._items.move_to_end(key)
        return value

    def put(self, key, value) -> None:
        if not self.capacity:
            return
        self._items[key] = value
        self._items.move_to_end(key)
        while len(self._items) > self.capacity:
            self._items.popitem(last=False)

    def __len__(self) -> int:
        return len(self._items)


def input_key(item) -> str | tuple:
    """The exact input as a hashable key (a text, a [text, pair] list, token ids, a {question, context}
    object); anything but a text is tagged, so the text "[101, 102]" and the ids [101, 102] differ."""
    return item if isinstance(item, str) else ("json", json.dumps(item, sort_keys=True, ensure_ascii=False))
