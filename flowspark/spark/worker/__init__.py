"""What runs inside Spark's Python workers: the stage function and what it calls.

`stage` (the stage function every lowering maps over its rows), `ops` (the stateless ops of a
stage), `codec` (items, sequences, the task-error marker), `rows` (a native sink's rows as
Arrow), `times` (Spark's timestamps as Python datetimes), `aggregates` (the Python pass over a
stage Spark aggregated). Nothing here builds a Spark plan: a worker imports only this
package, the plan's types and flowspark's core.
"""
