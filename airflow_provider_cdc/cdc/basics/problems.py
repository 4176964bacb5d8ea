"""Every problem a check finds, raised once: one error that lists each problem with its fix.

A setup that stops at the first problem makes its user fix one thing, run again, and meet the
next. :class:`Problems` collects what each check finds (a list of messages, or the
configuration error a check raises) and carries on; :meth:`Problems.raise_if_any` then raises a
single error. With one kind of problem the error is the one that check would have raised on its
own (same class, same message), so messages stay stable; with several, a
``CdcConfigurationError`` numbers them.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from airflow_provider_cdc.cdc.basics.errors import CdcConfigurationError


@dataclass(frozen=True)
class Problem:
    message: str  # what is wrong and the statement or setting that fixes it
    error: type[CdcConfigurationError] = CdcConfigurationError
    heading: str | None = None  # the check's heading when it reports a list (e.g. "captured tables are not ready")


class Problems:
    """Problems found by ``what`` (e.g. ``"setup"``), in the order found."""

    def __init__(self, what: str) -> None:
        self.what = what
        self.items: list[Problem] = []

    def __bool__(self) -> bool:
        return bool(self.items)

    def add(
        self,
        messages: Iterable[str],
        error: type[CdcConfigurationError] = CdcConfigurationError,
        heading: str | None = None,
    ) -> None:
        self.items.extend(Problem(message, error, heading) for message in messages)

    @contextmanager
    def check(self) -> Iterator[None]:
        """Record a configuration error raised in the block as one problem and carry on after it
        (the rest of the block is skipped). Other errors propagate."""
        try:
            yield
        except CdcConfigurationError as exc:
            self.items.append(Problem(str(exc), type(exc)))

    def error(self) -> CdcConfigurationError | None:
        if not self.items:
            return None
        classes = {p.error for p in self.items}
        headings = {p.heading for p in self.items}
        error = next(iter(classes)) if len(classes) == 1 else CdcConfigurationError
        if len(classes) == 1 and len(headings) == 1:  # one check's findings: that check's own message
            heading = next(iter(headings))
            if heading is None and len(self.items) == 1:
                return error(self.items[0].message)
            if heading is not None:
                bullet = "\n  - "
                return error(f"{heading}:{bullet}{bullet.join(p.message for p in self.items)}")
        listed = "\n".join(f"  {n}. " + p.message.replace("\n", "\n     ") for n, p in enumerate(self.items, start=1))
        return error(
            f"{self.what} found {len(self.items)} problems and created or changed nothing; "
            f"fix each of them, then run it again:\n{listed}"
        )

    def raise_if_any(self) -> None:
        error = self.error()
        if error is not None:
            raise error
