"""The operator log on a disk that refuses writes (full): each refused line is
dropped without a traceback, standard error says so once, and once the disk
takes lines again the file says how many were lost."""

from __future__ import annotations

import errno
import io
import logging

from warren.shards import logsetup
from warren.shards.logsetup import LogSettings


class FullDisk(io.StringIO):
    """A log stream whose disk is full while `full` is set."""

    full = False

    def __init__(self, real):
        super().__init__()
        self.real = real

    def write(self, text):
        if FullDisk.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        return self.real.write(text)

    def flush(self):
        if FullDisk.full:
            raise OSError(errno.ENOSPC, "No space left on device")
        self.real.flush()

    def fileno(self):
        return self.real.fileno()

    def close(self):
        self.real.close()
        super().close()


def test_a_full_disk_drops_log_lines_and_says_so_once(tmp_path, monkeypatch, capsys):
    path = tmp_path / "warren.log"
    real_open = logsetup.SharedRotatingFileHandler._open
    monkeypatch.setattr(logsetup.SharedRotatingFileHandler, "_open",
                        lambda self: FullDisk(real_open(self)))
    root = logging.getLogger()
    saved = root.handlers[:], root.level
    try:
        logsetup.configure(LogSettings(file=str(path)), "gateway")
        log = logging.getLogger("warren")
        log.info("before")
        FullDisk.full = True
        for n in range(5):
            log.info("lost %d", n)
        FullDisk.full = False
        log.info("after")
    finally:
        FullDisk.full = False
        for handler in root.handlers[:]:
            root.removeHandler(handler)
            handler.close()
        for handler in saved[0]:
            root.addHandler(handler)
        root.setLevel(saved[1])
    err = capsys.readouterr().err
    assert "Traceback" not in err and "Logging error" not in err
    assert err.count("cannot write the log file") == 1 and "No space left on device" in err
    lines = path.read_text().splitlines()
    assert [line.split("> ", 1)[1] for line in lines] == [
        "before", "after",
        f"the log file refused 5 lines before this one ({path}); they are lost"]
