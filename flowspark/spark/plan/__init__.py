"""The Spark plan: a flow's graph as stages, ports and sinks (pure data, printable, no session needed).

`types` holds the plan's dataclasses, which every later layer reads; `compiler` turns an
`ir.Graph` into a `types.Plan` (`compile_flow`). The optimizer (`flowspark.spark.rules`)
turns that plan into the physical plan the lowerings run.
"""
