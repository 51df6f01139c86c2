"""The report's output directory: a local path (or file:// URI) or any Hadoop URI.

What a person opens (summary.md, summary.json, the charts) sits at its top; Spark's
tables, with their part-files, _SUCCESS markers and .crc files, go under data/."""

from __future__ import annotations

import os
import shutil
from urllib.parse import urlparse

from pyspark.sql import DataFrame, SparkSession

DATA_DIR = "data"


class Output:
    """The output directory: a local path (or file:// URI), or any Hadoop URI, in
    which case summary and chart files are written through the Hadoop FileSystem."""

    def __init__(self, spark: SparkSession, out: str):
        self.spark = spark
        scheme = urlparse(out).scheme
        self.local = scheme in ("", "file") or (len(scheme) == 1 and os.name == "nt")
        if self.local:
            path = urlparse(out).path if scheme == "file" else out
            self.path = os.path.abspath(path)
            os.makedirs(self.path, exist_ok=True)
            self.uri = "file://" + self.path
        else:
            self.path = out.rstrip("/")
            self.uri = self.path

    def table(self, name: str) -> str:
        return f"{self.uri}/{DATA_DIR}/{name}"

    def write_table(self, df: DataFrame, name: str, sort: list | None = None,
                    small: bool = True) -> DataFrame:
        """Write `df` as Parquet and return the table read back (cheap to reuse).
        A small table goes to one file, sorted by `sort` (a shuffle of its few rows,
        which keeps the scan feeding it parallel and needs no range-sampling job)."""
        if small:
            df = df.repartition(1)
        if sort:
            df = df.sortWithinPartitions(*sort)
        df.write.mode("overwrite").parquet(self.table(name))
        # with the schema given, reading back needs no schema-inference job
        return self.spark.read.schema(df.schema).parquet(self.table(name))

    def delete(self, name: str) -> None:
        if self.local:
            shutil.rmtree(os.path.join(self.path, DATA_DIR, name), ignore_errors=True)
            return
        jvm = self.spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(self.table(name))
        path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration()).delete(path, True)

    def write_bytes(self, name: str, data: bytes) -> None:
        if self.local:
            with open(os.path.join(self.path, name), "wb") as f:
                f.write(data)
            return
        jvm = self.spark.sparkContext._jvm
        path = jvm.org.apache.hadoop.fs.Path(f"{self.uri}/{name}")
        fs = path.getFileSystem(self.spark.sparkContext._jsc.hadoopConfiguration())
        stream = fs.create(path, True)
        try:
            stream.write(bytearray(data))
        finally:
            stream.close()
