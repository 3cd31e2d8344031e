"""app/cache.py: the LRU cache is bounded in entries and in bytes, evicting the least recently used."""

from __future__ import annotations

import pytest

from app.cache import LRUCache


def test_the_byte_bound_evicts_the_least_recently_used_until_it_holds() -> None:
    cache = LRUCache(max_entries=10, max_bytes=100)
    for key in "abc":
        cache.put(key, key.upper(), size=40)
    assert cache.keys() == ["b", "c"] and cache.nbytes == 80  # 120 > 100: "a", the oldest, went
    assert cache.get("b") == "B"  # now "c" is the least recently used
    cache.put("d", "D", size=30)
    assert cache.keys() == ["b", "d"] and cache.nbytes == 70  # 110 > 100: "c" went, "b" stayed
    cache.put("b", "B2", size=10)  # a new size for a key replaces the old one's in the count
    assert cache.keys() == ["d", "b"] and cache.nbytes == 40
    cache.put("d", "D", size=100)  # exactly the budget fits, and evicts everything else
    assert cache.keys() == ["d"] and cache.nbytes == 100


def test_an_entry_larger_than_the_whole_budget_is_not_kept_and_evicts_nothing() -> None:
    cache = LRUCache(max_entries=10, max_bytes=100)
    cache.put("small", 1, size=60)
    cache.put("huge", 2, size=101)
    assert cache.get("huge") is None
    assert cache.keys() == ["small"] and cache.nbytes == 60


def test_the_entry_bound_holds_too_and_zero_entries_disables_the_cache() -> None:
    cache = LRUCache(max_entries=2, max_bytes=10**6)
    for key in "abc":
        cache.put(key, key, size=1)
    assert cache.keys() == ["b", "c"] and len(cache) == 2 and cache.nbytes == 2
    off = LRUCache(max_entries=0, max_bytes=10**6)
    off.put("a", "a", size=1)
    assert len(off) == 0 and off.get("a") is None


def test_negative_bounds_are_refused_naming_both() -> None:
    with pytest.raises(ValueError, match="max_entries=-1, max_bytes=5"):
        LRUCache(max_entries=-1, max_bytes=5)
