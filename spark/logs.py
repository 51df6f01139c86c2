"""Warren's shard statistics logs (schema v1, see shards/stats.py) as Spark reads them:
the files an input names, their lines parsed against an explicit schema into typed records
(bad lines kept and classified, never fatal), and how a record's time and file are written
in the report."""

from __future__ import annotations

import datetime as _dt
import glob
import os
import sys
from urllib.parse import unquote, urlparse

from pyspark.sql import DataFrame, SparkSession
from pyspark.sql import functions as F
from pyspark.sql import types as T

SCHEMA_VERSION = 1
DEFAULT_PATTERN = "shard-*.jsonl*"
COUNTERS = ("published", "published_bytes", "delivered", "redelivered", "acked", "rejected",
            "requeued", "expired", "dead_lettered", "timeouts")
GAUGES = ("ready", "unacked", "consumers", "ram_bytes")
SHARD_COUNTERS = ("fsyncs", "messages")
LATENCIES = ("p50", "p90", "p99", "max")
CORRUPT = "_corrupt_record"
BAD_LINE_CHARS = 2000          # how much of a bad line the bad_lines table keeps


def resolve_inputs(spark: SparkSession, inputs: list[str],
                   pattern: str = DEFAULT_PATTERN) -> list[str]:
    """Expand directories (to their `pattern` files) and globs into a sorted list of
    file URIs, through the Hadoop FileSystem API so any supported scheme works.
    Only file names travel to the driver here, never their contents."""
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    Path = jvm.org.apache.hadoop.fs.Path
    files: list[str] = []
    for arg in inputs:
        path = Path(arg)
        fs = path.getFileSystem(conf)
        statuses = fs.globStatus(path)
        if not statuses:
            raise FileNotFoundError(f"no input matches {arg}")
        for status in statuses:
            if status.isDirectory():
                children = fs.globStatus(Path(status.getPath(), pattern)) or []
                found = sorted(c.getPath().toString() for c in children if c.isFile())
                if not found:
                    print(f"warning: no {pattern} files in {status.getPath().toString()}",
                          file=sys.stderr)
                files.extend(found)
            else:
                files.append(status.getPath().toString())
    unique = sorted(set(files))
    if not unique:
        raise FileNotFoundError(f"no log files in {', '.join(inputs)}")
    return unique


def local_input_bytes(inputs: list[str], pattern: str = DEFAULT_PATTERN) -> int | None:
    """The size of the files `inputs` name when all are local paths (found as
    resolve_inputs finds them), else None. Read before Spark starts, to size it."""
    files: set[str] = set()
    for arg in inputs:
        scheme = urlparse(arg).scheme
        if scheme not in ("", "file"):
            return None
        path = urlparse(arg).path if scheme == "file" else arg
        for match in glob.glob(path) or [path]:
            if os.path.isdir(match):
                files.update(glob.glob(os.path.join(match, pattern)))
            elif os.path.isfile(match):
                files.add(match)
    return sum(os.path.getsize(f) for f in files if os.path.isfile(f))


def total_bytes(spark: SparkSession, files: list[str]) -> int:
    jvm = spark.sparkContext._jvm
    conf = spark.sparkContext._jsc.hadoopConfiguration()
    total = 0
    for f in files:
        path = jvm.org.apache.hadoop.fs.Path(f)
        total += path.getFileSystem(conf).getFileStatus(path).getLen()
    return total


def record_schema() -> T.StructType:
    """Every field the report uses, typed; extra fields in a line are ignored, missing
    ones are null. `_corrupt_record` catches lines that are not valid JSON or whose
    fields have the wrong type."""
    long_, str_, dbl = T.LongType(), T.StringType(), T.DoubleType()
    fields = [T.StructField("v", long_), T.StructField("type", str_),
              T.StructField("ts", dbl), T.StructField("shard", T.IntegerType()),
              T.StructField("vhost", str_), T.StructField("queue", str_),
              T.StructField("queue_type", str_), T.StructField("kind", str_)]
    fields += [T.StructField(name, long_) for name in COUNTERS + GAUGES + SHARD_COUNTERS]
    fields += [T.StructField("fsync_batch", T.MapType(str_, long_)),
               T.StructField("confirm_latency_ms",
                             T.StructType([T.StructField(p, dbl) for p in LATENCIES])),
               T.StructField(CORRUPT, str_)]
    return T.StructType(fields)


def read_lines(spark: SparkSession, files: list[str]) -> DataFrame:
    """(file, value): one row per line."""
    text = spark.read.text(files)
    try:
        return text.select(F.col("_metadata.file_path").alias("file"), "value")
    except Exception:  # a source without the _metadata column
        return text.select(F.input_file_name().alias("file"), "value")


def parse_records(lines: DataFrame) -> DataFrame:
    """Every line with its `status`: ok, malformed (not a JSON object, or a field of the
    wrong type), unknown_version or missing_field. Valid rows carry the typed fields;
    bad rows keep (the start of) their text in `line`."""
    parsed = lines.select("file", "value", F.from_json(
        "value", record_schema(),
        {"mode": "PERMISSIVE", "columnNameOfCorruptRecord": CORRUPT}).alias("r"))
    r = F.col("r")
    status = (F.when(r.isNull(), "malformed")
              .when(r["v"].isNotNull() & (r["v"] != SCHEMA_VERSION), "unknown_version")
              .when(r[CORRUPT].isNotNull() | ~F.rtrim("value").endswith("}"), "malformed")
              .when(r["v"].isNull() | r["type"].isNull() | r["ts"].isNull()
                    | r["shard"].isNull(), "missing_field")
              .otherwise("ok"))
    fields = [r[f.name].alias(f.name) for f in record_schema().fields if f.name != CORRUPT]
    return (parsed.select("file", status.alias("status"), "value", *fields)
            .select("file", "status",
                    F.when(F.col("status") != "ok",
                           F.substring("value", 1, BAD_LINE_CHARS)).alias("line"),
                    *[f.name for f in record_schema().fields if f.name != CORRUPT]))


def iso_time(ts: float | None) -> str:
    if ts is None:
        return "-"
    moment = _dt.datetime.fromtimestamp(ts, _dt.timezone.utc)
    return moment.strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def short_path(path: str) -> str:
    parsed = urlparse(path)
    return unquote(parsed.path) if parsed.scheme == "file" else path
