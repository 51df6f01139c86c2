"""The report's Spark session: sized for a small box and quiet unless asked.

Quiet means Spark logs errors only (log4j2.properties beside this file, loaded when
this process starts the driver JVM; sc.setLogLevel when spark-submit started it), no
console progress bar, and the JVM's own start-up notice dropped from its stderr.
Verbose leaves Spark's logging as Spark sets it up."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading

from pyspark import SparkConf, SparkContext
from pyspark.java_gateway import launch_gateway
from pyspark.sql import SparkSession

LOG4J2_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "log4j2.properties")
# The JVM prints this itself (Spark adds --add-modules=jdk.incubator.vector), before
# any logging configuration applies.
JVM_NOISE = re.compile(rb"^WARNING: Using incubator modules")


def build_session(master: str | None = None, shuffle_partitions: int = 4,
                  driver_memory: str | None = None, conf: dict | None = None,
                  app_name: str = "warren-stats-report", verbose: bool = False,
                  short_run: bool = False) -> SparkSession:
    """A session sized for a small box: few shuffle partitions, no UI, quiet logs.

    Without `master` the session uses what spark-submit was given, or local[*]. With
    so few partitions adaptive execution has little to coalesce and costs a re-plan
    per stage, so it is off unless `conf` turns it on. A `short_run` (a small input)
    gets a driver JVM with the C1 compiler only, which warms up faster: on a run of
    seconds the optimising compiler's work costs more than it saves."""
    settings = {
        "spark.sql.shuffle.partitions": str(shuffle_partitions),
        "spark.default.parallelism": str(max(shuffle_partitions, 2)),
        "spark.ui.enabled": "false",
        "spark.ui.showConsoleProgress": "true" if verbose else "false",
        "spark.sql.session.timeZone": "UTC",
        "spark.sql.adaptive.enabled": "false",
        "spark.sql.debug.maxToStringFields": "200",
    }
    if driver_memory:  # only takes effect when this call starts the JVM
        settings["spark.driver.memory"] = driver_memory
    settings.update(conf or {})
    if master:
        settings["spark.master"] = master
    java_options = [settings.get("spark.driver.extraJavaOptions", "")]
    if short_run:
        java_options.append("-XX:TieredStopAtLevel=1")
    if not verbose:
        java_options.append(f"-Dlog4j2.configurationFile=file:{LOG4J2_CONFIG}")
    if " ".join(java_options).strip():
        settings["spark.driver.extraJavaOptions"] = " ".join(java_options).strip()
    # SparkContext._gateway is private, but it is how to tell whether this process has
    # a JVM yet (then it is reused, whatever the settings say).
    if not verbose and SparkContext._gateway is None and "PYSPARK_GATEWAY_PORT" not in os.environ:
        _start_quiet_context(app_name, settings)
    builder = SparkSession.builder.appName(app_name)
    for key, value in settings.items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    if not verbose:
        spark.sparkContext.setLogLevel("ERROR")
    return spark


def _start_quiet_context(app_name: str, settings: dict) -> None:
    """Start the driver JVM with its stderr filtered, and a context on it which the
    session builder then picks up."""
    conf = SparkConf().setAppName(app_name).setAll(list(settings.items()))
    gateway = launch_gateway(conf, popen_kwargs={"stderr": subprocess.PIPE})
    threading.Thread(target=_pass_stderr, args=(gateway.proc.stderr,), daemon=True,
                     name="spark-jvm-stderr").start()
    SparkContext(conf=conf, gateway=gateway)


def _pass_stderr(stream) -> None:
    """Copy the JVM's stderr to ours, less its start-up notice (errors still show)."""
    out = sys.stderr.buffer
    for line in iter(stream.readline, b""):
        if not JVM_NOISE.match(line):
            out.write(line)
            out.flush()
