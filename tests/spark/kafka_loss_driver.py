"""A driver program for the broker-loss test: a keyed running count, Kafka -> Kafka, on a 1-second trigger.

Usage: python kafka_loss_driver.py BOOTSTRAP SOURCE_TOPIC SINK_TOPIC CHECKPOINT TIMEOUT [OPTION=VALUE ...]

flowspark creates the session (with the cached Kafka connector in `spark.jars`); the
`OPTION=VALUE` pairs are options of the `KafkaSource` (say `kafka.default.api.timeout.ms=10000`).
The run stops after `TIMEOUT` seconds. A `FlowsparkError` is printed on stderr as
`failed: <its line>` (exit status 1), as a user's script would print it; a run `TIMEOUT`
stopped prints `stopped` (exit status 0).
"""

from __future__ import annotations

import sys

from kafka_driver import build

from flowspark.errors import FlowsparkError


def main() -> None:
    bootstrap, src, dst, chk, timeout = sys.argv[1:6]
    options = dict(arg.split("=", 1) for arg in sys.argv[6:])
    from flowspark.spark import run

    try:
        run(
            build(bootstrap, src, dst, options, "kafka_loss"),
            checkpoint=chk,
            trigger="1 second",
            progress=False,
            timeout=float(timeout),
        )
    except FlowsparkError as e:
        print(f"failed: {e}", file=sys.stderr)
        sys.exit(1)
    print("stopped", file=sys.stderr)


if __name__ == "__main__":
    main()
