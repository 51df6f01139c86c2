"""The operator log's configuration, applied the same way in the gateway and in
every shard process (not the shards' statistics logs: see stats.py).

It lives here, not under gateway/, because shard processes must not import the
gateway; the gateway already imports warren.shards for the shard protocol, and
the settings travel to a shard in its ShardSpec (records.py).

Lines read as RabbitMQ's (`2026-01-01 12:00:00.000001+00:00 [info] <gateway>
accepting AMQP connection (...)`, a multi-line message repeating the prefix on
every line), with the process in place of the Erlang pid; or, with format
"json", one JSON object a line (time, level, logger, msg, process and the
record's structured fields such as connection, user, vhost). python-json-logger
makes those: a well-kept formatter that turns a record's `extra` fields into
keys and serialises what json cannot (a stdlib Formatter would redo both).

One file for all processes, rotated by size (as RabbitMQ's
log.file.rotation.size and .count). Each line is written under a lock on the
file's folder (SharedRotatingFileHandler): the process reopens the path if
another rotated it, rotates it if the line would take it past its size, and
appends the line. So the size holds however the lines are spread over the
processes (with several gateways the root writes few), and no line lands in a
file already rotated.
"""

from __future__ import annotations

import datetime
import fcntl
import logging
import logging.handlers
import os
import sys

import msgspec
from pythonjsonlogger.json import JsonFormatter

LEVELS = ("debug", "info", "warning", "error", "critical")
FORMATS = ("text", "json")
STDERR = "-"


class LogSettings(msgspec.Struct, frozen=True):
    level: str = "info"
    file: str = STDERR  # a path, or "-" for standard error
    format: str = "text"
    rotation_size: int = 10 << 20  # bytes before the file is rotated (0: never)
    rotation_count: int = 5  # rotated files kept: FILE.1 ... FILE.N


class SharedRotatingFileHandler(logging.handlers.RotatingFileHandler):
    """A RotatingFileHandler for a file that several processes append to. A line
    the disk refuses (full) is dropped with one line on standard error, not a
    traceback each; the first line written again is followed by how many were."""

    dropped = 0  # lines refused since the last the file took

    def emit(self, record: logging.LogRecord) -> None:
        # The size check, the rotation and the write under one lock: another process
        # can neither rotate between this one's check and its write (the line would
        # land in the rotated file) nor append in between (past the size).
        try:
            lock = os.open(os.path.dirname(os.path.abspath(self.baseFilename)), os.O_RDONLY)
        except OSError:
            self.handleError(record)
            return
        try:
            fcntl.flock(lock, fcntl.LOCK_EX)
            dropped = self.dropped
            super().emit(record)  # its errors go to handleError
            if dropped and self.dropped == dropped:  # the file takes lines again
                self.dropped = 0
                super().emit(logging.LogRecord(
                    record.name, logging.WARNING, __file__, 0,
                    "the log file refused %d lines before this one (%s); they are lost",
                    (dropped, self.baseFilename), None))
        finally:
            os.close(lock)

    def handleError(self, record: logging.LogRecord) -> None:
        error = sys.exc_info()[1]
        if not isinstance(error, OSError):
            super().handleError(record)
            return
        if not self.dropped:
            sys.stderr.write(f"warren: cannot write the log file {self.baseFilename} "
                             f"({error.strerror or error}): dropping its lines until it can\n")
        self.dropped += 1
        # Opened again for the next line: what the stream still buffers is dropped too.
        stream, self.stream = self.stream, None
        if stream is not None:
            try:
                stream.close()
            except OSError:
                pass

    def shouldRollover(self, record: logging.LogRecord) -> bool:
        if self.stream is None:
            return False
        if not self._current():  # another process rotated it: write to the new file
            self.stream.close()
            self.stream = self._open()
        if self.maxBytes <= 0:
            return False
        size = os.fstat(self.stream.fileno()).st_size
        return size > 0 and size + len(self.format(record)) + 1 >= self.maxBytes

    def _current(self) -> bool:
        """Is the open file still the one the path names?"""
        try:
            return os.stat(self.baseFilename).st_ino == os.fstat(self.stream.fileno()).st_ino
        except FileNotFoundError:
            return False


def configure(settings: LogSettings, process: str) -> None:
    """Send every logger's records at `settings.level` and above to the configured
    output, labelled with `process` ('gateway', 'shard-1'). Raises OSError when
    the file cannot be opened."""
    if settings.file == STDERR:
        handler: logging.Handler = logging.StreamHandler(sys.stderr)
    else:
        handler = SharedRotatingFileHandler(
            settings.file, maxBytes=settings.rotation_size,
            backupCount=settings.rotation_count, encoding="utf-8")
    handler.setFormatter(JsonLines(process) if settings.format == "json"
                         else TextLines(process))
    root = logging.getLogger()
    for old in list(root.handlers):
        root.removeHandler(old)
        old.close()
    root.addHandler(handler)
    root.setLevel(settings.level.upper())


def _time(record: logging.LogRecord) -> str:
    """Local time with microseconds and offset, as RabbitMQ writes it."""
    return datetime.datetime.fromtimestamp(record.created).astimezone().isoformat(
        sep=" ", timespec="microseconds")


class TextLines(logging.Formatter):
    """RabbitMQ's text lines: `TIME [level] <process> message`, each line of a
    multi-line message (or traceback) with the same prefix, so grep finds it whole."""

    def __init__(self, process: str):
        super().__init__()
        self.process = process

    def format(self, record: logging.LogRecord) -> str:
        text = record.getMessage()
        if record.exc_info and not record.exc_text:
            record.exc_text = self.formatException(record.exc_info)
        if record.exc_text:
            text = f"{text}\n{record.exc_text}"
        prefix = f"{_time(record)} [{record.levelname.lower()}] <{self.process}> "
        return "\n".join(prefix + line for line in text.split("\n"))


class JsonLines(JsonFormatter):
    """python-json-logger's formatter with RabbitMQ's JSON keys (time, level in lower
    case, msg) plus the logger, the process and the record's `extra` fields."""

    def __init__(self, process: str):
        super().__init__(["levelname", "name", "message"],
                         rename_fields={"levelname": "level", "name": "logger",
                                        "message": "msg"},
                         static_fields={"process": process}, json_ensure_ascii=False)

    def add_fields(self, log_data: dict, record: logging.LogRecord, message_dict: dict) -> None:
        log_data["time"] = _time(record)
        super().add_fields(log_data, record, message_dict)
        log_data["level"] = record.levelname.lower()
