"""Operational logs: plain text for people, or JSON lines for log pipelines.

`fleetgate serve --log-format json` writes one JSON object per line to stderr:
`{"ts", "level", "logger", "message"}`, plus `request_id` when the line was logged while
serving a request, and `exception` with the traceback when there is one. (The request
log, `request_log.path`, is a separate JSONL record per request.)
"""

from __future__ import annotations

import contextvars
import logging
import sys
import time

import orjson

# the request being served by this task (set by the pipeline), for log lines about it
request_id: contextvars.ContextVar[str | None] = contextvars.ContextVar(
    "fleetgate_request_id", default=None
)

TEXT_FORMAT = "%(asctime)s %(levelname)s %(name)s: %(message)s"


class JsonFormatter(logging.Formatter):
    def format(self, record: logging.LogRecord) -> str:
        line: dict[str, object] = {
            "ts": time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(record.created))
            + f".{int(record.msecs):03d}Z",
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        rid = request_id.get()
        if rid is not None:
            line["request_id"] = rid
        if record.exc_info:
            line["exception"] = self.formatException(record.exc_info)
        return orjson.dumps(line).decode()


def configure(level: str, fmt: str = "text") -> None:
    """The process's logging: one stderr handler, text or JSON lines."""
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    logging.getLogger("httpx").setLevel(logging.WARNING)  # one line per scrape is noise
