"""Topic matching: RabbitMQ's documented cases and a hypothesis check against a
straightforward reference matcher."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from warren.gateway.broker.topic import TopicTrie


def reference_match(binding: list[str], words: list[str]) -> bool:
    if not binding:
        return not words
    head, rest = binding[0], binding[1:]
    if head == "#":
        return any(reference_match(rest, words[i:]) for i in range(len(words) + 1))
    if not words:
        return False
    return (head == "*" or head == words[0]) and reference_match(rest, words[1:])


CASES = [
    ("a.b.c", "a.b.c", True), ("a.*.c", "a.b.c", True), ("a.*.c", "a.c", False),
    ("a.#.c", "a.c", True), ("a.#.c", "a.b.b.c", True), ("#", "", True), ("#", "a.b", True),
    ("*", "", True), ("*", "a.b", False), ("", "", True), ("", "a", False),
    ("a.#", "a", True), ("#.a", "a", True), ("#.#", "", True), ("a..b", "a..b", True),
    ("a.*.b", "a..b", True), ("*.*", "a.", True), ("#.b.#", "b", True),
    ("quick.orange.rabbit", "quick.orange.rabbit", True), ("*.orange.*", "quick.orange.fox",
                                                           True),
    ("*.*.rabbit", "lazy.orange.elephant", False), ("lazy.#", "lazy.orange.male.rabbit", True),
    ("*.orange.*", "orange", False), ("*.orange.*", "quick.orange.male.rabbit", False),
]


@pytest.mark.parametrize("binding,key,expected", CASES)
def test_rabbitmq_cases(binding, key, expected):
    trie = TopicTrie()
    trie.add(binding, "q")
    assert (trie.match(key) == {"q"}) is expected
    assert reference_match(binding.split("."), key.split(".")) is expected


words = st.sampled_from(["a", "b", "", "c"])
bindings = st.lists(st.one_of(words, st.sampled_from(["*", "#"])), min_size=1, max_size=5)
keys = st.lists(words, min_size=1, max_size=6)


@given(st.lists(bindings, min_size=1, max_size=8), st.lists(keys, min_size=1, max_size=8),
       st.data())
def test_trie_agrees_with_reference(binding_lists, key_lists, data):
    trie = TopicTrie()
    for i, b in enumerate(binding_lists):
        trie.add(".".join(b), i)
    removed = data.draw(st.sets(st.integers(0, len(binding_lists) - 1)))
    for i in removed:
        trie.remove(".".join(binding_lists[i]), i)
    for key in key_lists:
        expected = {i for i, b in enumerate(binding_lists)
                    if i not in removed and reference_match(b, key)}
        assert trie.match(".".join(key)) == expected


def test_ten_thousand_bindings_match_without_scanning():
    trie = TopicTrie()
    for i in range(10_000):
        trie.add(f"stock.{i}.*", i)
    trie.add("stock.#", "all")
    assert trie.match("stock.42.nyse") == {42, "all"}
    calls = 0
    original = trie._match

    def counting(*args):
        nonlocal calls
        calls += 1
        return original(*args)

    trie._match = counting
    trie.match("stock.42.nyse")
    assert calls < 20  # follows the key's words, never visits the 10,000 siblings
