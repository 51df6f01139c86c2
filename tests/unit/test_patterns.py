"""Users' regular expressions run by RE2 (gateway/patterns.py): the same answers
as a backtracking engine on what both run, in linear time on what stalls one."""

from __future__ import annotations

import re
import time

from hypothesis import given, settings
from hypothesis import strategies as st

from warren.gateway.broker import auth, patterns, policies
from warren.gateway.management.listing import listing
from warren.storage.metastore import PolicyDef

ALPHABET = "ab.-"


def _regex(children):
    """Patterns from pieces both engines read alike: groups, alternation,
    repetition, classes, anchors."""
    quantified = st.tuples(children, st.sampled_from(["*", "+", "?", "{1,2}", "{2}", ""])).map(
        lambda t: f"(?:{t[0]}){t[1]}" if t[1] else t[0])
    return st.one_of(
        st.lists(quantified, min_size=1, max_size=3).map("".join),
        st.tuples(children, children).map(lambda t: f"(?:{t[0]}|{t[1]})"),
        children.map(lambda p: f"({p})"))


_ATOMS = st.sampled_from(["a", "b", "\\.", "-", ".", "[ab]", "[^a]", "\\w", "a-"])
PATTERNS = st.tuples(st.booleans(), st.recursive(_ATOMS, _regex, max_leaves=8),
                     st.booleans()).map(lambda t: ("^" if t[0] else "") + t[1] +
                                        ("$" if t[2] else ""))


@settings(max_examples=300, deadline=None)
@given(PATTERNS, st.text(ALPHABET, max_size=12))
def test_patterns_answer_as_a_backtracking_engine_does(pattern, name):
    assert patterns.search(pattern, name) == (re.search(pattern, name) is not None)


def test_catastrophic_patterns_match_in_linear_time():
    """The issue's `^(a+)+$` took 7.9 s on 'a'*26+'b' in Python's re; RE2 answers
    in microseconds, and a 255-byte name costs no more than a short one much."""
    evil = ["^(a+)+$", "^(a|aa)+$", "^(a|a?)+$", "^(a*)*b$", "(.*){1000}x", "(x+x+)+y"]
    name = "a" * 254 + "c"
    started = time.perf_counter()
    for pattern in evil:
        assert patterns.problem(pattern) is None
        for _ in range(100):
            assert not patterns.search(pattern, name)
    assert time.perf_counter() - started < 1.0  # 600 matches; a backtracker: years


def test_what_RE2_cannot_run_is_refused_with_its_reason():
    assert patterns.problem("(a") == "missing ): (a"
    assert "(?=" in patterns.problem("(?=a)b")  # lookahead
    assert patterns.problem("(a)\\1") is not None  # backreference
    assert patterns.problem("a++") is not None  # possessive
    assert "too large" in patterns.problem("(?:a.){1000}(?:b.){1000}(?:c.){1000}")
    assert patterns.problem("^(queue-1|queue-2|orders\\..*)$") is None


def test_a_pattern_that_cannot_run_matches_nothing_and_grants_nothing():
    assert not patterns.search("(?=a)", "a")
    assert not auth.permits("(?=a)", "a") and not auth.permits("", "a")
    assert auth.permits("^mg-", "mg-q") and not auth.permits("^mg-", "va-q")


def test_names_with_lone_surrogates_are_matched_not_raised_on():
    assert patterns.search("^q", "q\udc00") and not patterns.search("^a", "q\udc00")


def test_policies_and_listings_use_them():
    evil = PolicyDef("/", "evil", "^(a+)+$", "all", 0, {"max-length": 1})
    started = time.perf_counter()
    assert policies.select([evil], "a" * 26 + "b", "queue") is None
    assert policies.select([evil], "a" * 26, "queue") is evil
    items = [{"name": "a" * n + "b"} for n in range(20, 24)] + [{"name": "aaa"}]
    assert listing(items, {"name": "^(a+)+$", "use_regex": "true"}) == [{"name": "aaa"}]
    assert time.perf_counter() - started < 0.5
    assert policies.problems(PolicyDef("/", "p", "(?<=a)b", "all", 0, {"max-length": 1})) \
        .startswith("invalid pattern '(?<=a)b': ")
