"""What a session flowspark creates for a plan needs beyond pyspark: Kafka's connector, Delta Lake.

`session_conf(plan)` is read only when flowspark creates a classic session (`get_session`'s
`new_conf`), before the JVM starts: the cached jars in `spark.jars` and Delta's settings.
A session you pass, or Spark Connect, is taken as it is.
"""

from __future__ import annotations

from typing import Any

from flowspark.spark.io import delta, kafka
from flowspark.spark.io.inputs import SparkSource
from flowspark.spark.io.outputs import SparkSink

__all__ = ["delta_steps", "session_conf"]


def delta_steps(plan: Any) -> list[str]:
    """The ids of the steps of `plan` that read or write Delta Lake (`SparkSource`/`SparkSink` `"delta"`).

    Args:
        plan: A `flowspark.spark.plan.types.Plan`.

    Returns:
        The step ids, inputs first (a dead letter written to Delta last).
    """
    steps = [st.steps[0] for st in plan.stages if isinstance(st.source, SparkSource) and st.source.format == "delta"]
    steps += [sk.step_id for sk in plan.sinks if isinstance(sk.sink, SparkSink) and sk.sink.format == "delta"]
    if isinstance(plan.dead_letter, SparkSink) and plan.dead_letter.format == "delta":
        from flowspark.deadletter import dead_letter_step

        steps.append(dead_letter_step(plan.flow_id))
    return steps


def session_conf(plan: Any) -> dict[str, str]:
    """The settings a session flowspark creates for `plan` needs before it starts.

    Args:
        plan: A `flowspark.spark.plan.types.Plan`.

    Returns:
        `{}` for a flow without Kafka or Delta; else `spark.jars` (the cached jars of both, as
        needed) and, for Delta, `delta.delta_conf`'s settings.

    Raises:
        FlowsparkCompileError: A jar set is missing or not built for the installed pyspark
            (`kafka.session_conf`, `delta.delta_conf`): one line naming the step and the fix.
    """
    conf = dict(kafka.session_conf(plan))
    steps = delta_steps(plan)
    if steps:
        more = delta.delta_conf(steps[0])
        jars = [j for j in (conf.get("spark.jars"), more.pop("spark.jars")) if j]
        conf.update(more, **{"spark.jars": ",".join(jars)})
    return conf
