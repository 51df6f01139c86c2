"""The management API's pure parts, driven directly: rates from samples and the
list parameters (filter, sort, pages, columns)."""

from __future__ import annotations

import pytest

from warren.gateway.management.http import HTTPError
from warren.gateway.management.listing import listing
from warren.gateway.management.rates import WINDOW, Rates


def test_a_rate_counts_from_zero_at_start_before_any_sample():
    rates = Rates(start=100.0)
    assert rates.rate("q", 102.0, {"published": 50}) == {"published": 25.0}


def test_a_key_first_seen_in_a_sample_started_at_zero_at_the_sample_before():
    rates = Rates(start=0.0)
    rates.sample(10.0, {"totals": {"received": 0}})
    rates.sample(11.0, {"totals": {"received": 0}, "q": {"published": 30}})
    assert rates.rate("q", 12.0, {"published": 40}) == {"published": 20.0}


def test_a_rate_averages_over_the_window_and_forgets_older_samples():
    rates = Rates(start=0.0)
    for second in range(1, 21):  # 10 a second for 10 s, then 100 a second
        count = 10 * min(second, 10) + 100 * max(second - 10, 0)
        rates.sample(float(second), {"q": {"n": count}})
    assert rates.rate("q", 20.0, {"n": 1100}) == {"n": pytest.approx(100.0, rel=0.25)}
    assert WINDOW <= 10


def test_a_counter_that_went_down_has_no_rate_and_gone_keys_are_forgotten():
    rates = Rates(start=0.0)
    for second in range(1, 9):
        rates.sample(float(second), {"q": {"n": 500 * second}})
    assert rates.rate("q", 9.0, {"n": 3}) == {"n": 0.0}  # its shard restarted
    rates.sample(9.0, {})
    assert rates.rate("q", 10.0, {"n": 3}) == {"n": 3.0}  # as if new since the last sample


ITEMS = [{"name": "b", "n": 2, "stats": {"rate": 1.0}}, {"name": "a", "n": 10},
         {"name": "c", "n": 1, "stats": {"rate": 5.0}}, {"name": "ab", "n": 3}]


def test_name_filters_sort_and_columns():
    assert [i["name"] for i in listing(ITEMS, {"name": "A"})] == ["a", "ab"]
    assert [i["name"] for i in listing(ITEMS, {"name": "^a$", "use_regex": "true"})] == ["a"]
    assert [i["name"] for i in listing(ITEMS, {"sort": "n"})] == ["c", "b", "ab", "a"]
    # a missing nested field sorts first
    assert [i["name"] for i in listing(ITEMS, {"sort": "stats.rate", "sort_reverse": "true"})] \
        == ["c", "b", "a", "ab"]
    assert listing(ITEMS, {"columns": "name,stats.rate", "sort": "name"}) == [
        {"name": "a"}, {"name": "ab"}, {"name": "b", "stats": {"rate": 1.0}},
        {"name": "c", "stats": {"rate": 5.0}}]


def test_pages_in_rabbitmqs_shape():
    assert listing(ITEMS, {"page": "2", "page_size": "3", "sort": "name", "columns": "name"}) \
        == {"filtered_count": 4, "item_count": 1, "items": [{"name": "c"}], "page": 2,
            "page_count": 2, "page_size": 3, "total_count": 4}
    assert listing([], {"page": "1"})["page_count"] == 0


@pytest.mark.parametrize("query, reason", [
    ({"page": "0"}, "Pagination parameters are invalid"),
    ({"page": "x"}, "Pagination parameters are invalid"),
    ({"page": "1", "page_size": "501"}, "Pagination parameters are invalid"),
    ({"page": "3", "page_size": "2"}, "Page out of range"),
    ({"name": "(", "use_regex": "true"}, "invalid regular expression"),
])
def test_bad_list_parameters(query, reason):
    with pytest.raises(HTTPError) as raised:
        listing(ITEMS, query)
    assert raised.value.status == 400 and reason in raised.value.reason
