"""The management API's route table (management/routes.py), in-process: each route
is one handler that exists, a path is served only by a route that names it whole,
and a method a route does not take lists those it takes.
tests/e2e/test_management_routes.py has the same through a broker's HTTP API."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from warren.gateway.management import routes

METHODS = ("GET", "PUT", "POST", "DELETE", "PATCH")


def test_each_route_is_one_handler_that_exists():
    from warren.gateway.management.api import HANDLERS
    for route in routes.ROUTES:
        assert callable(HANDLERS.get(route.handler)), route
    assert set(HANDLERS) == {route.handler for route in routes.ROUTES}
    patterns = [r.pattern for r in routes.ROUTES]
    assert len(patterns) == len(set(patterns))


def fits(pattern: tuple[str, ...], parts: list[str]) -> bool:
    return len(pattern) == len(parts) and all(p in ("*", part) for p, part in zip(pattern, parts))


@settings(max_examples=300, deadline=None)
@given(st.sampled_from(routes.ROUTES),
       st.lists(st.text(min_size=1, max_size=12), min_size=1, max_size=3),
       st.sampled_from(METHODS))
def test_a_path_under_a_route_is_served_only_by_a_route_that_names_it_whole(route, suffix,
                                                                         method):
    parts = [p if p != "*" else "name" for p in route.pattern] + suffix
    whole = [r for r in routes.ROUTES if fits(r.pattern, parts)]
    try:
        handler = routes.match(parts, method)
    except routes.NotServed as unserved:
        assert not [r for r in whole if method in r.methods]
        assert set(unserved.allowed) == {m for r in whole for m in r.methods}
    else:
        assert any(r.handler == handler and method in r.methods for r in whole)


def test_a_route_with_a_method_it_does_not_take_lists_those_it_takes():
    assert routes.match(["vhosts", "v"], "DELETE") == "vhosts"
    with pytest.raises(routes.NotServed) as unserved:
        routes.match(["users", "u", "permissions"], "DELETE")
    assert unserved.value.allowed == ("GET",)
