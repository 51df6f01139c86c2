"""The suite's kinds, one folder each, run fastest first: unit (pure parts
in-process), session (the whole connection and channel in-process, no socket),
e2e (real `warren serve` processes over TCP). tests/support holds their helpers."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import settings

HERE = Path(__file__).resolve().parent

# No per-example deadline: on a shared 2-core machine running the suite in three
# workers, one example's first call (imports, a cold cache) can take a second,
# and a deadline then fails a test for the machine's load, not for Warren.
settings.register_profile("warren", deadline=None)
settings.load_profile("warren")
KINDS = ("unit", "session", "e2e")


def pytest_addoption(parser):
    parser.addoption("--gateways", default="1,2",
                     help="gateway processes of the brokers the end-to-end tests start; "
                          "with several counts (1,2) each of those tests runs with each")


def kind_of(path: Path) -> str:
    """A test's kind, by its folder. Beside the load-testing tools, the probes'
    tests are unit tests; the bench's start brokers and run `warren bench`."""
    if path.is_relative_to(HERE):
        folder = path.relative_to(HERE).parts[0]
        return folder if folder in KINDS else "e2e"
    return "unit" if "probes" in path.parts else "e2e"


def pytest_collection_modifyitems(config, items):
    # Marked by kind (`-m unit`), and ordered unit, session, e2e: a plain run fails
    # fast on the quick kinds. Within a kind the modules marked slow start first, so
    # that the two workers end together rather than one waiting out a long module.
    # The sort is stable and made the same in every xdist worker, so --dist loadfile
    # still sends each file whole to one worker.
    for item in items:
        item.add_marker(getattr(pytest.mark, kind_of(item.path)))
    items.sort(key=lambda item: (KINDS.index(kind_of(item.path)),
                                 item.get_closest_marker("slow") is None))
