"""Progress bars for long work a person waits for at a terminal (tqdm, on stderr).

On only when both stdout and stderr are terminals, so a redirected or piped run, a test and
CI print nothing extra; never with JSON output (pass `json_output`). FLEETGATE_PROGRESS=0
turns them off, =1 on (still never with JSON output).
"""

from __future__ import annotations

import os
import shutil
import sys
from collections.abc import Iterable, Iterator
from types import TracebackType
from typing import Any, TypeVar

T = TypeVar("T")


def enabled(json_output: bool = False) -> bool:
    if json_output:
        return False
    forced = os.environ.get("FLEETGATE_PROGRESS", "").strip()
    if forced in ("0", "1"):
        return forced == "1"
    return _tty(sys.stdout) and _tty(sys.stderr)


def _tty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):  # replaced or closed streams
        return False


class _Off:
    """What `bar` returns when progress is off: every call does nothing."""

    def __init__(self, total: float = 0) -> None:
        self.total = total
        self.n: float = 0

    def update(self, n: float = 1) -> None:
        self.n += n

    def set_postfix_str(self, s: str = "", refresh: bool = True) -> None:
        pass

    def set_description_str(self, desc: str = "", refresh: bool = True) -> None:
        pass

    def close(self) -> None:
        pass

    def __enter__(self) -> _Off:
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        pass


def bar(total: float, desc: str, unit: str = "it", *, on: bool | None = None, **kw: Any) -> Any:
    """A tqdm bar on stderr (or a no-op): `update(n)`, `set_postfix_str(s)`, `close()`, a
    context manager. `on` defaults to `enabled()`."""
    if not (enabled() if on is None else on):
        return _Off(total)
    from tqdm import tqdm

    try:
        known = os.get_terminal_size(sys.stderr.fileno()).columns > 0
    except (OSError, ValueError):
        known = False
    # a terminal that reports no size (some ptys): tqdm would draw nothing (0 columns, -1 rows)
    size = shutil.get_terminal_size()
    width = {"dynamic_ncols": True} if known else {"ncols": size.columns, "nrows": size.lines}
    return tqdm(total=total, desc=desc, unit=unit, file=sys.stderr, leave=False, **width, **kw)


def iterate(
    items: Iterable[T], total: int, desc: str, unit: str = "it", *, on: bool | None = None
) -> Iterator[T]:
    """`items`, advancing a bar by one per item."""
    with bar(total, desc, unit, on=on) as b:
        for item in items:
            yield item
            b.update(1)
