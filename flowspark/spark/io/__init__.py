"""Spark's own sources and sinks, and the Python data source.

`inputs` (`SparkSource`: files, tables, DataFrames, batch or streaming), `outputs`
(`SparkSink`, `ForeachBatchSink`, writing a DataFrame of rows), `kafka` (`KafkaSource`,
`KafkaSink`), `pysource` (flowspark's partitioned sources as a Spark Python data source),
`columns` (column helpers both lowerings use).
"""
