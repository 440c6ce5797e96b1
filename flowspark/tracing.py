"""Logging and tracing configuration, with the names of `bytewax.tracing`.

Bytewax's `setup_tracing` starts its Rust tracer. flowspark has no Rust
runtime; the same call configures Python `logging` for the `flowspark` logger
(and its children) at the requested level, and, when a `JaegerConfig` or
`OtlpTracingConfig` is given and OpenTelemetry's SDK is installed, sets
OpenTelemetry's global tracer provider to export spans there. flowspark does
not depend on OpenTelemetry: without it the call sets up logging only and
issues a `RuntimeWarning` that traces are not exported.

```python
from flowspark.tracing import OtlpTracingConfig, setup_tracing

tracer = setup_tracing(OtlpTracingConfig("my-flow"), log_level="INFO")
```

Differences from Bytewax, and why:

- flowspark's runtimes emit no spans of their own (Bytewax's Rust runtime
  traces its operators). With OpenTelemetry installed, the spans your code
  starts with `opentelemetry.trace.get_tracer(...)` go to the configured
  backend.
- Log records go to stderr (Bytewax's tracer prints to stdout), so output a
  flow prints on stdout stays clean. If logging is already configured (the
  root logger has handlers), no handler is added and records propagate to it.
- Calling `setup_tracing` again reconfigures (Bytewax's second call hangs);
  dropping the returned guard does not stop logging: call `guard.close()` or
  use it as a context manager.
- `"TRACE"` is logged as `logging.DEBUG - 5` (Python has no trace level).
"""

from __future__ import annotations

import logging
import sys
import warnings
from types import TracebackType
from typing import Any, Optional

from flowspark.errors import FlowsparkTypeError

__all__ = [
    "LOG_LEVELS",
    "JaegerConfig",
    "OtlpTracingConfig",
    "TracingConfig",
    "TracingGuard",
    "setup_tracing",
]

#: The Python logging level `setup_tracing` uses for `"TRACE"` (Python has no trace level).
TRACE = logging.DEBUG - 5

#: The levels `setup_tracing` accepts (case-insensitive), as Python logging levels.
LOG_LEVELS: dict[str, int] = {
    "ERROR": logging.ERROR,
    "WARN": logging.WARNING,
    "WARNING": logging.WARNING,
    "INFO": logging.INFO,
    "DEBUG": logging.DEBUG,
    "TRACE": TRACE,
}

_LOGGER_NAME = "flowspark"
_log = logging.getLogger(__name__)


def _check_service(cls: str, service_name: Any) -> str:
    if not isinstance(service_name, str) or not service_name:
        msg = f"{cls}: service_name must be a non-empty str such as 'my-flow'; received {service_name!r}"
        raise FlowsparkTypeError(msg)
    return service_name


def _check_ratio(cls: str, ratio: Any) -> float:
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)):
        msg = f"{cls}: sampling_ratio must be a number between 0.0 and 1.0; received {ratio!r}"
        raise FlowsparkTypeError(msg)
    if not 0.0 <= ratio <= 1.0:
        msg = f"{cls}: sampling_ratio must be between 0.0 and 1.0; received {ratio!r}"
        raise ValueError(msg)
    return float(ratio)


def _check_opt_str(cls: str, name: str, value: Any) -> Optional[str]:
    if value is not None and not isinstance(value, str):
        msg = f"{cls}: {name} must be a str or None; received {value!r} of type {type(value).__name__}"
        raise FlowsparkTypeError(msg)
    return value


class TracingConfig:
    """Base class of the tracing backends `setup_tracing` accepts.

    Use `JaegerConfig` or `OtlpTracingConfig`; `TracingConfig()` itself (as in
    Bytewax) means "no backend": logging only.
    """

    def __repr__(self) -> str:
        """Show the settings."""
        attrs = ", ".join(f"{k.lstrip('_')}={v!r}" for k, v in vars(self).items())
        return f"{type(self).__name__}({attrs})"


class JaegerConfig(TracingConfig):
    """Send traces to a Jaeger agent (needs `opentelemetry-exporter-jaeger-thrift`).

    Args:
        service_name: Names this dataflow in Jaeger.
        endpoint: `"host:port"` of the agent (default `"127.0.0.1:6831"`, or
            the `OTEL_EXPORTER_JAEGER_AGENT_HOST` / `_PORT` environment variables).
        sampling_ratio: Fraction of traces to send, 0.0 to 1.0.

    Raises:
        FlowsparkTypeError: An argument of the wrong type.
        ValueError: `sampling_ratio` outside 0.0 to 1.0.

    Example:
        >>> cfg = JaegerConfig("my-flow", sampling_ratio=0.5)
        >>> cfg.service_name, cfg.endpoint, cfg.sampling_ratio
        ('my-flow', None, 0.5)
    """

    def __init__(self, service_name: str, endpoint: Optional[str] = None, sampling_ratio: float = 1.0) -> None:
        """Configure a Jaeger backend."""
        self._service_name = _check_service("JaegerConfig", service_name)
        self._endpoint = _check_opt_str("JaegerConfig", "endpoint", endpoint)
        self._sampling_ratio = _check_ratio("JaegerConfig", sampling_ratio)

    @property
    def service_name(self) -> str:
        """Names this dataflow in Jaeger."""
        return self._service_name

    @property
    def endpoint(self) -> Optional[str]:
        """`"host:port"` of the Jaeger agent, or `None` for the default."""
        return self._endpoint

    @property
    def sampling_ratio(self) -> float:
        """Fraction of traces to send."""
        return self._sampling_ratio


class OtlpTracingConfig(TracingConfig):
    """Send traces to an OpenTelemetry collector over gRPC (needs `opentelemetry-exporter-otlp-proto-grpc`).

    Args:
        service_name: Names this dataflow in the traces.
        url: The collector's gRPC endpoint (default `"http://127.0.0.1:4317"`, or
            the `OTEL_EXPORTER_OTLP_*ENDPOINT` environment variables).
        sampling_ratio: Fraction of traces to send, 0.0 to 1.0.

    Raises:
        FlowsparkTypeError: An argument of the wrong type.
        ValueError: `sampling_ratio` outside 0.0 to 1.0.

    Example:
        >>> cfg = OtlpTracingConfig("my-flow", url="http://collector:4317")
        >>> cfg.service_name, cfg.url, cfg.sampling_ratio
        ('my-flow', 'http://collector:4317', 1.0)
    """

    def __init__(self, service_name: str, url: Optional[str] = None, sampling_ratio: float = 1.0) -> None:
        """Configure an OTLP backend."""
        self._service_name = _check_service("OtlpTracingConfig", service_name)
        self._url = _check_opt_str("OtlpTracingConfig", "url", url)
        self._sampling_ratio = _check_ratio("OtlpTracingConfig", sampling_ratio)

    @property
    def service_name(self) -> str:
        """Names this dataflow in the traces."""
        return self._service_name

    @property
    def url(self) -> Optional[str]:
        """The collector's endpoint, or `None` for the default."""
        return self._url

    @property
    def sampling_ratio(self) -> float:
        """Fraction of traces to send."""
        return self._sampling_ratio


class TracingGuard:
    """What `setup_tracing` returns (Bytewax returns a `BytewaxTracer`): undoes the setup on `close()`.

    Attributes:
        level: The Python logging level set on the `flowspark` logger.
        handler: The stderr handler added, or `None` when logging was already configured.
        tracer_provider: The OpenTelemetry `TracerProvider` installed, or `None`.
    """

    def __init__(self, level: int, handler: Optional[logging.Handler], tracer_provider: Any) -> None:
        """Record what `setup_tracing` set up."""
        self.level = level
        self.handler = handler
        self.tracer_provider = tracer_provider
        self._closed = False

    def close(self) -> None:
        """Flush and shut down exporting, remove the handler and reset the logger's level."""
        global _ACTIVE
        if self._closed:
            return
        self._closed = True
        if self.tracer_provider is not None:
            self.tracer_provider.shutdown()
        logger = logging.getLogger(_LOGGER_NAME)
        if self.handler is not None:
            logger.removeHandler(self.handler)
        logger.setLevel(logging.NOTSET)
        if _ACTIVE is self:
            _ACTIVE = None

    def __enter__(self) -> TracingGuard:
        """Use as a context manager: tracing stops when the block ends."""
        return self

    def __exit__(
        self, exc_type: Optional[type[BaseException]], exc: Optional[BaseException], tb: Optional[TracebackType]
    ) -> None:
        """Close."""
        self.close()

    def __repr__(self) -> str:
        """Short description."""
        state = "closed" if self._closed else "active"
        return f"<TracingGuard {state} level={logging.getLevelName(self.level)}>"


_ACTIVE: Optional[TracingGuard] = None


def _level(log_level: Any) -> int:
    if log_level is None:
        return logging.ERROR
    if not isinstance(log_level, str):
        msg = (
            f"setup_tracing: log_level must be a str, one of {', '.join(LOG_LEVELS)}; received {log_level!r} "
            f"of type {type(log_level).__name__}"
        )
        raise FlowsparkTypeError(msg)
    level = LOG_LEVELS.get(log_level.upper())
    if level is None:
        msg = f"setup_tracing: unknown log_level {log_level!r}; use one of {', '.join(LOG_LEVELS)}"
        raise ValueError(msg)
    return level


def _not_exported(msg: str, stacklevel: int = 4) -> None:
    # A warning, not a log record: the default log level (ERROR) would hide it. The
    # stack level points at the user's call of setup_tracing.
    warnings.warn(msg, RuntimeWarning, stacklevel=stacklevel)


def _provider(config: TracingConfig) -> Any:
    """Return an OpenTelemetry TracerProvider exporting to `config`, or None (and warn) when that is impossible."""
    if not isinstance(config, (JaegerConfig, OtlpTracingConfig)):
        return None
    try:
        from opentelemetry.sdk.resources import Resource
        from opentelemetry.sdk.trace import TracerProvider
        from opentelemetry.sdk.trace.export import BatchSpanProcessor
        from opentelemetry.sdk.trace.sampling import ParentBased, TraceIdRatioBased
    except ImportError:
        _not_exported(
            f"{type(config).__name__}: opentelemetry-sdk is not installed, so traces are not exported (logging "
            "is set up); install opentelemetry-sdk and an exporter to export the spans your code creates"
        )
        return None
    exporter: Any
    try:
        if isinstance(config, OtlpTracingConfig):
            from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter

            url = config.url
            exporter = OTLPSpanExporter(endpoint=url, insecure=True) if url else OTLPSpanExporter()
        else:
            from opentelemetry.exporter.jaeger.thrift import JaegerExporter

            if config.endpoint:
                host, _, port = config.endpoint.rpartition(":")
                exporter = JaegerExporter(agent_host_name=host or "127.0.0.1", agent_port=int(port))
            else:
                exporter = JaegerExporter()
    except ImportError as e:
        pkg = (
            "opentelemetry-exporter-otlp-proto-grpc"
            if isinstance(config, OtlpTracingConfig)
            else "opentelemetry-exporter-jaeger-thrift"
        )
        _not_exported(
            f"{type(config).__name__}: {pkg} is not installed ({e}), so traces are not exported (logging is set up)"
        )
        return None
    provider = TracerProvider(
        resource=Resource.create({"service.name": config.service_name}),
        sampler=ParentBased(TraceIdRatioBased(config.sampling_ratio)),
    )
    provider.add_span_processor(BatchSpanProcessor(exporter))
    return provider


def setup_tracing(tracing_config: Optional[TracingConfig] = None, log_level: Optional[str] = None) -> TracingGuard:
    """Set up flowspark's logging (and OpenTelemetry tracing when available), as `bytewax.tracing.setup_tracing`.

    Sets the `flowspark` logger to `log_level` and, unless logging is already
    configured (the root logger has handlers), adds a handler printing its
    records on stderr. With a `JaegerConfig` or `OtlpTracingConfig` and
    OpenTelemetry's SDK and exporter installed, installs a global tracer
    provider that exports there (once per process: OpenTelemetry refuses to
    replace it). A second call replaces the first one's setup.

    Args:
        tracing_config: Where to send traces; `None` for logging only.
        log_level: `"ERROR"` (default), `"WARN"`, `"INFO"`, `"DEBUG"` or
            `"TRACE"`, in any case.

    Returns:
        A `TracingGuard`; `close()` it (or use `with`) to undo the setup.

    Raises:
        FlowsparkTypeError: `tracing_config` is not a `TracingConfig` or `log_level` not a str.
        ValueError: `log_level` is not one of the names above.

    Example:
        >>> import logging
        >>> guard = setup_tracing(log_level="debug")
        >>> logging.getLogger("flowspark").getEffectiveLevel() == logging.DEBUG
        True
        >>> guard.close()
    """
    global _ACTIVE
    if tracing_config is not None and not isinstance(tracing_config, TracingConfig):
        msg = (
            f"setup_tracing: tracing_config must be a TracingConfig (JaegerConfig or OtlpTracingConfig) or None; "
            f"received {tracing_config!r} of type {type(tracing_config).__name__}"
        )
        raise FlowsparkTypeError(msg)
    level = _level(log_level)
    if _ACTIVE is not None:
        _ACTIVE.close()
    logger = logging.getLogger(_LOGGER_NAME)
    logger.setLevel(level)
    handler: Optional[logging.Handler] = None
    if not logging.getLogger().handlers:
        handler = logging.StreamHandler(sys.stderr)
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
        logger.addHandler(handler)
    provider = None
    if tracing_config is not None:
        provider = _provider(tracing_config)
        if provider is not None:
            from opentelemetry import trace

            trace.set_tracer_provider(provider)
            if trace.get_tracer_provider() is not provider:
                _not_exported(
                    f"{type(tracing_config).__name__}: OpenTelemetry already has a tracer provider in this process "
                    "and does not replace it; spans go to the first one",
                    stacklevel=3,
                )
                provider.shutdown()
                provider = None
    _ACTIVE = TracingGuard(level, handler, provider)
    _log.debug("tracing set up: level %s, config %r", logging.getLevelName(level), tracing_config)
    return _ACTIVE
