"""A network namespace a test makes for itself: a veth pair between it and the
host, with a /30 of 10.231.0.0/16 on it, so a process inside can be cut off
from everything (the host side's link down) and joined again. Traffic stays
on addresses the test made. Skipped where namespaces cannot be made (not
root, no `ip`)."""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess

import pytest

_serial = itertools.count()


class Namespace:
    def __init__(self) -> None:
        index = (os.getpid() * 7 + next(_serial)) % 16000
        self.name = f"warren-t{index}"
        self.host_link, self.inside_link = f"wh{index}", f"wn{index}"
        base = 4 * index  # a /30 each: .1 the host's end, .2 the namespace's
        self.host_ip = f"10.231.{base // 256}.{base % 256 + 1}"
        self.inside_ip = f"10.231.{base // 256}.{base % 256 + 2}"

    @property
    def prefix(self) -> list[str]:
        """What runs a command inside it."""
        return ["ip", "netns", "exec", self.name]

    def create(self) -> "Namespace":
        if os.geteuid() != 0 or shutil.which("ip") is None:
            pytest.skip("network namespaces need root and iproute2's ip")
        self.destroy()
        steps = [["ip", "netns", "add", self.name],
                 ["ip", "link", "add", self.host_link, "type", "veth", "peer", "name",
                  self.inside_link],
                 ["ip", "link", "set", self.inside_link, "netns", self.name],
                 ["ip", "addr", "add", f"{self.host_ip}/30", "dev", self.host_link],
                 ["ip", "link", "set", self.host_link, "up"],
                 [*self.prefix, "ip", "addr", "add", f"{self.inside_ip}/30", "dev",
                  self.inside_link],
                 [*self.prefix, "ip", "link", "set", self.inside_link, "up"],
                 [*self.prefix, "ip", "link", "set", "lo", "up"]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True)
            if done.returncode:
                self.destroy()
                pytest.skip(f"cannot make a network namespace here: {' '.join(step)}: "
                            f"{done.stderr.strip()}")
        return self

    def cut(self) -> None:
        """Nothing passes between the namespace and the host any more."""
        subprocess.run(["ip", "link", "set", self.host_link, "down"], check=True)

    def heal(self) -> None:
        subprocess.run(["ip", "link", "set", self.host_link, "up"], check=True)

    def run(self, *command: str, timeout: float = 30.0) -> subprocess.CompletedProcess:
        return subprocess.run([*self.prefix, *command], capture_output=True, text=True,
                              timeout=timeout)

    def destroy(self) -> None:
        subprocess.run(["ip", "link", "del", self.host_link], capture_output=True)
        subprocess.run(["ip", "netns", "del", self.name], capture_output=True)

    def __enter__(self) -> "Namespace":
        return self.create()

    def __exit__(self, *exc_info) -> None:
        self.destroy()
