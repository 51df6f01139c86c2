"""The instruction counter's pure parts (loadtest/probes/instructions.py): reading a
callgrind dump, telling the broker's processes apart, the report."""

from __future__ import annotations

from warren.loadtest.probes.instructions import Count, dumped_instructions, report, role_of

DUMP = """# callgrind format
version: 1
creator: callgrind-3.19.0
pid: 4242
part: 2

positions: line
events: Ir
summary: 95821000

fn=(1) main
16 3
"""


def test_the_dump_s_summary_is_its_count(tmp_path):
    (tmp_path / "cg.4242.2").write_text(DUMP)
    (tmp_path / "cg.old").write_text(DUMP.replace("summary:", "totals:"))
    (tmp_path / "cg.cut").write_text(DUMP.split("summary:")[0])
    assert dumped_instructions(tmp_path / "cg.4242.2") == 95_821_000
    assert dumped_instructions(tmp_path / "cg.old") == 95_821_000
    assert dumped_instructions(tmp_path / "cg.cut") is None  # not written out yet
    assert dumped_instructions(tmp_path / "missing") is None


def test_processes_are_told_apart_by_their_command_lines():
    valgrind = ["valgrind", "--tool=callgrind", "--trace-children=yes", "/usr/bin/python3"]
    assert role_of([*valgrind, "-m", "warren.shards.main", "1"]) == "shard 1"
    assert role_of([*valgrind, "-m", "warren.gateway.cli.main", "serve", "--port", "1"]) == "gateway"
    assert role_of([*valgrind, "-m", "warren.gateway.node.worker"]) == "gateway"
    assert role_of([*valgrind, "-c", "from multiprocessing.resource_tracker import main;main(6)"]) \
        is None


def test_the_report_gives_each_process_and_the_total_a_message():
    text = report([Count(7, "shard 1", 67_000_000), Count(5, "gateway", 95_000_000),
                   Count(6, "shard 0", 230_000)], 1000, "header")
    lines = text.splitlines()
    assert lines[0] == "header"
    assert [line.split()[0] for line in lines[1:]] == ["gateway", "shard", "shard", "total"]
    assert lines[1].split()[-1] == "95,000"
    assert lines[2].split()[1] == "0" and lines[2].split()[-1] == "230"
    assert lines[4].split()[-1] == "162,230"
