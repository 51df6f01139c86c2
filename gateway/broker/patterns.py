"""Regular expressions that users supply (policy patterns, permissions, the
management API's name filters), run by RE2: a match takes time linear in the
name whatever the pattern, where a backtracking engine spends minutes on
`^(a+)+$` against 'aaaa...b' and stalls every client of its process. RE2 has no
backreferences, lookaround, possessive quantifiers or atomic groups, so patterns
using them are refused where they are set. Patterns and names are matched as
UTF-8 (lone surrogates passed through), so no name raises."""

from __future__ import annotations

from functools import lru_cache

import re2

# RE2 instructions a pattern may compile to: a match that falls back from RE2's
# DFA to its NFA costs up to this times the name's length, still a millisecond
# for a 255-byte name. A list of a few hundred names fits.
MAX_PROGRAM = 10_000

_OPTIONS = re2.Options()
_OPTIONS.log_errors = False  # refusals go to whoever set the pattern, not to stderr
_OPTIONS.never_capture = True  # only whether it matches: RE2 answers from its DFA


class Invalid(ValueError):
    """A pattern RE2 cannot run, or too large: its reason."""


@lru_cache(maxsize=4096)
def _compiled(pattern: str):
    """The compiled pattern, or the reason it cannot be: remembered either way,
    since the same patterns are matched at every declaration."""
    try:
        regexp = re2.compile(_utf8(pattern), _OPTIONS)
    except re2.error as error:
        reason = error.args[0] if error.args else "invalid"
        return reason.decode("utf-8", "replace") if isinstance(reason, bytes) else str(reason)
    if regexp.programsize > MAX_PROGRAM:
        return f"pattern too large ({regexp.programsize} instructions, at most {MAX_PROGRAM})"
    return regexp


def problem(pattern: str) -> str | None:
    """Why `pattern` cannot be used, or None."""
    found = _compiled(pattern)
    return found if isinstance(found, str) else None


def matcher(pattern: str):
    """A function telling whether `pattern` matches anywhere in a name (as
    RabbitMQ's re:run does); Invalid when it cannot be used."""
    found = _compiled(pattern)
    if isinstance(found, str):
        raise Invalid(found)
    return lambda name: found.search(_utf8(name)) is not None


def search(pattern: str, name: str) -> bool:
    """Does `pattern` match anywhere in `name`? Never for a pattern that cannot be
    used (one set before it was checked, say)."""
    found = _compiled(pattern)
    return not isinstance(found, str) and found.search(_utf8(name)) is not None


def _utf8(text: str) -> bytes:
    return text.encode("utf-8", "surrogatepass")
