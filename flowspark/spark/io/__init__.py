"""Spark's own sources and sinks, and the Python data source.

`inputs` (`SparkSource`: files, Delta tables, tables, DataFrames, batch or streaming),
`outputs` (`SparkSink`, `ForeachBatchSink`, writing a DataFrame of rows), `kafka`
(`KafkaSource`, `KafkaSink`), `delta` (Delta Lake's build for each pyspark line, its
settings), `jars` (the jar cache `scripts/fetch_jars.py` fills), `classpath` (what a session
flowspark creates for a plan needs: Kafka's and Delta's jars, Delta's settings), `pysource`
(flowspark's partitioned sources as a Spark Python data source), `columns` (column helpers
both lowerings use).
"""
