"""Offline analysis of Warren's shard statistics logs with PySpark.

* ``python -m spark.report DATA/logs --out DIR`` (or ``spark-submit spark/report.py``)
  reads the JSON-lines logs written by :mod:`shards.stats` and writes Parquet
  tables, PNG charts, ``summary.md`` and ``summary.json`` into DIR.
* ``python -m spark.synth OUT_DIR --records N`` writes large synthetic logs in the
  same schema, for trying the report at scale.

Needs the ``spark`` extra (pyspark, matplotlib, pyarrow) and a Java runtime.
"""
