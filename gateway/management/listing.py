"""The list parameters of RabbitMQ's management API, applied to any list
endpoint: `name` (a substring, or a regular expression with `use_regex=true`),
`sort` (a field, dotted for nested ones such as message_stats.publish) with
`sort_reverse`, `page` and `page_size` (answered in RabbitMQ's paged shape) and
`columns` (the fields to keep, dotted too)."""

from __future__ import annotations

import math

from ..broker import patterns
from .http import Request, Response, bad_request

PAGE_SIZE = 100  # RabbitMQ's default and largest page sizes
MAX_PAGE_SIZE = 500


def listed(request: Request, items: list[dict]) -> Response:
    """A list endpoint's answer, filtered, sorted, paged and cut to columns as the
    request's query asks."""
    return Response.json(listing(items, request.query))


def listing(items: list[dict], query: dict):
    """`items` as the query asks: a list, or a page object when `page` is given."""
    total = len(items)
    name = query.get("name")
    if name:
        if query.get("use_regex") == "true":
            try:
                matches = patterns.matcher(name)
            except patterns.Invalid as error:
                raise bad_request(f"invalid regular expression '{name}': {error}") from None
            items = [i for i in items if matches(str(i.get("name", "")))]
        else:
            needle = name.lower()
            items = [i for i in items if needle in str(i.get("name", "")).lower()]
    if query.get("sort"):
        path = query["sort"].split(".")
        # missing fields sort first, then numbers, then text: a mixed column sorts
        items = sorted(items, key=lambda i: _sort_key(_get(i, path)),
                       reverse=query.get("sort_reverse") == "true")
    elif query.get("sort_reverse") == "true":
        items = items[::-1]
    page = None
    if "page" in query:
        page, size = _number(query["page"]), _number(query.get("page_size", str(PAGE_SIZE)))
        if page is None or size is None or page < 1 or not 1 <= size <= MAX_PAGE_SIZE:
            raise bad_request("Pagination parameters are invalid")
        pages = math.ceil(len(items) / size)
        if page > max(pages, 1):
            raise bad_request("Page out of range")
        filtered = len(items)
        items = items[(page - 1) * size:page * size]
    if query.get("columns"):
        columns = [c.split(".") for c in query["columns"].split(",") if c]
        items = [_columns(i, columns) for i in items]
    if page is None:
        return items
    return {"filtered_count": filtered, "item_count": len(items), "items": items,
            "page": page, "page_count": pages, "page_size": size, "total_count": total}


def _number(text: str) -> int | None:
    return int(text) if text.isascii() and text.isdigit() else None


def _get(item, path: list[str]):
    for part in path:
        if not isinstance(item, dict) or part not in item:
            return None
        item = item[part]
    return item


def _sort_key(value) -> tuple:
    if value is None:
        return (0, 0, "")
    if isinstance(value, (int, float)):
        return (1, value, "")
    return (2, 0, str(value))


def _columns(item: dict, columns: list[list[str]]) -> dict:
    picked: dict = {}
    for path in columns:
        parent = _get(item, path[:-1])
        if not isinstance(parent, dict) or path[-1] not in parent:
            continue  # RabbitMQ leaves a missing column out
        target = picked
        for part in path[:-1]:
            target = target.setdefault(part, {})
        target[path[-1]] = parent[path[-1]]
    return picked
