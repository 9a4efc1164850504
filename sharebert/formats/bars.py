"""Progress on long work: bars on a terminal, plain periodic lines elsewhere.

In a log that is not a terminal (CI, ``nohup``, ``make demo > log``) every bar refresh, and the cursor
codes of nested bars, would flood the file. There :func:`bar` prints its meter as one plain line at
most every ``LINE_SECONDS`` and once at the end (``prepare: 12.0MB/100MB [00:04<00:29, 3.0MB/s]``), and
the Trainer prints one line per log event (``training.log_lines.LogLines``).
"""

from __future__ import annotations

import sys
import time

from tqdm.auto import tqdm

LINE_SECONDS = 30.0


def interactive() -> bool:
    """Whether standard error is a terminal (where bars redraw in place)."""
    return sys.stderr.isatty()


class _Null:
    """Where a line-printing bar sends tqdm's own writes (carriage returns, clears)."""

    def write(self, text):
        pass

    def flush(self):
        pass


class _Lines(tqdm):
    """A tqdm that prints its meter as whole lines on standard error (no carriage returns, no cursor moves),
    at most every ``LINE_SECONDS``, when it completes, and its last state when closed early."""

    def __init__(self, iterable=None, **kwargs):
        self._printed_at, self._printed_n = 0.0, None
        known = kwargs.get("total") is not None or hasattr(iterable, "__len__")
        line = (
            "{desc}: {percentage:.0f}% {n_fmt}/{total_fmt} [{elapsed}<{remaining}, {rate_fmt}{postfix}]"
            if known
            else "{desc}: {n_fmt} [{elapsed}, {rate_fmt}{postfix}]"
        )
        super().__init__(iterable, file=_Null(), mininterval=LINE_SECONDS, bar_format=line, **kwargs)

    def _print(self):
        self._printed_at, self._printed_n = time.monotonic(), self.n
        print(self.__str__(), file=sys.stderr, flush=True)

    def display(self, msg=None, pos=None):
        done = self.total is not None and self.n >= self.total
        if (
            msg != ""
            and self.n
            and self.n != self._printed_n
            and (done or time.monotonic() - self._printed_at >= LINE_SECONDS)
        ):
            self._print()
        return True

    def close(self):
        if not self.disable and self.n and self.n != self._printed_n:
            self._print()
        super().close()


def bar(iterable=None, progress: bool = True, **kwargs):
    """``tqdm(iterable, **kwargs)`` when ``progress``: a bar on a terminal, plain periodic lines elsewhere."""
    if not progress:
        return tqdm(iterable, disable=True, **kwargs)
    if interactive():
        return tqdm(iterable, **kwargs)
    return _Lines(iterable, **kwargs)
