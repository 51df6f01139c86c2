"""Topic-exchange matching with a trie, so matching cost follows the routing key's
length, not the number of bindings.

RabbitMQ's rules: keys are words separated by '.', '*' matches exactly one word,
'#' matches zero or more words; words may be empty ('a..b' has three words, ''
is one empty word).
"""

from __future__ import annotations


class _Node:
    __slots__ = ("children", "destinations")

    def __init__(self):
        self.children: dict[str, _Node] = {}  # word, '*' or '#' -> node
        self.destinations: set = set()


class TopicTrie:
    def __init__(self):
        self._root = _Node()

    def add(self, binding_key: str, destination) -> None:
        node = self._root
        for word in binding_key.split("."):
            node = node.children.setdefault(word, _Node())
        node.destinations.add(destination)

    def remove(self, binding_key: str, destination) -> None:
        path = [self._root]
        words = binding_key.split(".")
        for word in words:
            node = path[-1].children.get(word)
            if node is None:
                return
            path.append(node)
        path[-1].destinations.discard(destination)
        # Prune nodes left with neither destinations nor children.
        for word, node, parent in zip(reversed(words), reversed(path[1:]), reversed(path[:-1])):
            if node.destinations or node.children:
                break
            del parent.children[word]

    def match(self, routing_key: str) -> set:
        words = routing_key.split(".")
        found: set = set()
        self._match(self._root, words, 0, found)
        return found

    def _match(self, node: _Node, words: list[str], i: int, found: set) -> None:
        children = node.children
        if i == len(words):
            found |= node.destinations
        else:
            child = children.get(words[i])
            if child is not None:
                self._match(child, words, i + 1, found)
            child = children.get("*")
            if child is not None:
                self._match(child, words, i + 1, found)
        hash_node = children.get("#")
        if hash_node is not None:
            # '#' swallows zero or more of the remaining words.
            for j in range(i, len(words) + 1):
                self._match(hash_node, words, j, found)
