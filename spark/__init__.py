"""Offline analysis of Warren's shard statistics logs with PySpark.

* ``python -m warren.spark.report DATA/logs --out DIR`` (or ``spark-submit spark/report.py``)
  reads the JSON-lines logs written by :mod:`shards.stats` and writes ``summary.md``,
  ``summary.json`` and PNG charts into DIR, its Parquet tables under DIR/data.
* ``python -m warren.spark.synth OUT_DIR --records N`` writes large synthetic logs in the
  same schema, for trying the report at scale.

Needs the ``spark`` extra (pyspark, matplotlib, pyarrow) and a Java runtime.
"""
