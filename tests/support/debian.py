"""Files out of Debian's packages for tests that drive a program Warren does
not ship (RabbitMQ's rabbitmqadmin, say): the package is downloaded and unpacked
into a cache, not installed, so nothing it depends on comes along."""

from __future__ import annotations

import glob
import os
import shutil
import subprocess

CACHE = os.path.join(os.path.expanduser("~"), ".cache", "warren-tests", "debian")


def unpacked(package: str, path: str) -> str | None:
    """`path` (absolute, as the package installs it) out of Debian's `package`,
    or None where apt cannot download it here."""
    root = os.path.join(CACHE, package)
    found = root + path
    if os.path.exists(found):
        return found
    if not shutil.which("apt-get") or not shutil.which("dpkg-deb"):
        return None
    download = os.path.join(CACHE, "downloads")
    os.makedirs(download, exist_ok=True)

    def fetch() -> bool:
        return subprocess.run(["apt-get", "download", package], cwd=download, check=False,
                              capture_output=True, timeout=600).returncode == 0

    if not fetch():  # a machine whose package lists were never read
        if os.geteuid() != 0:
            return None
        subprocess.run(["apt-get", "update"], check=False, capture_output=True, timeout=600)
        if not fetch():
            return None
    debs = sorted(glob.glob(os.path.join(download, f"{package}_*.deb")))
    if not debs:
        return None
    unpacking = root + ".partial"
    shutil.rmtree(unpacking, ignore_errors=True)
    subprocess.run(["dpkg-deb", "-x", debs[-1], unpacking], check=True, capture_output=True)
    shutil.rmtree(root, ignore_errors=True)
    os.rename(unpacking, root)  # whole or not at all, for the next run
    return found if os.path.exists(found) else None
