"""The product's modules import each other without a circle, and the gateway's
rooms only downwards: amqp < the value modules < broker < session < io <
cluster < management < node < cli. Type-only imports count too: a circle through
TYPE_CHECKING still ties the modules together for a reader."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("gateway", "shards", "storage", "spark", "loadtest")
FLOORS = {"amqp": 0, "broker": 2, "session": 3, "io": 4, "cluster": 5, "management": 6, "node": 7,
          "cli": 8}


def modules() -> dict[str, Path]:
    found = {}
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*.py"):
            parts = path.relative_to(ROOT).with_suffix("").parts
            if "tests" in parts:
                continue
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(("warren", *parts))] = path
    return found


def imports(name: str, path: Path, known: dict[str, Path]) -> set[str]:
    """The product modules `name` imports, anywhere in it."""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    wanted = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package.split(".")[:len(package.split(".")) - node.level + 1]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            wanted |= {target, *(f"{target}.{alias.name}" for alias in node.names)}
        elif isinstance(node, ast.Import):
            wanted |= {alias.name for alias in node.names}
    return {module for module in wanted if module in known and module != name}


def graph() -> dict[str, set[str]]:
    known = modules()
    return {name: imports(name, path, known) for name, path in known.items()}


def circles(edges: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        for other in edges[node]:
            if other not in index:
                visit(other)
                low[node] = min(low[node], low[other])
            elif other in stack:
                low[node] = min(low[node], index[other])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in edges:
        if node not in index:
            visit(node)
    return found


def floor(name: str) -> int | None:
    parts = name.split(".")
    if parts[1] != "gateway":
        return None
    return FLOORS.get(parts[2], 1) if len(parts) > 2 else 1


def test_no_import_circle_anywhere_in_the_product():
    assert circles(graph()) == []


def test_the_gateway_imports_only_downwards():
    upward = sorted((name, other) for name, targets in graph().items() for other in targets
                    if floor(name) is not None and floor(other) is not None
                    and floor(other) > floor(name))
    assert upward == []


def test_the_checks_see_a_circle_and_the_floors():
    # the checks themselves: a made-up circle is found, the real graph is read
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert "warren.gateway.amqp.frames" in graph()["warren.gateway.session.channel"]
    assert floor("warren.gateway.session.channel") < floor("warren.gateway.io.process")
