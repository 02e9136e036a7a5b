"""Writes that ride out a busy or restarting database: :func:`retrying` runs one whole transaction again, with backoff,
while it fails transiently (SQLite's ``database is locked``, a PostgreSQL serialization failure or deadlock, a
server restarting), and turns a write refused for good into one line (:class:`StoreWriteError`).
"""
from __future__ import annotations

import functools
import logging
import os
import random
import time
from collections.abc import Callable
from typing import Any, TypeVar

from sqlalchemy.exc import DBAPIError, IntegrityError, OperationalError

from harness.contract.errors import BenchInputError
from harness.contract.secrets import hide_passwords

__all__ = ["CONNECTION_LOST", "RETRY_FOR_S", "StoreWriteError", "cause", "retrying", "transient"]

log = logging.getLogger("bench")

RETRY_FOR_S = float(os.environ.get("BENCH_STORE_RETRY_S", "60"))
"""How long a write keeps retrying a transient failure (locked, serialization failure, deadlock, a database server
restarting); environment variable ``BENCH_STORE_RETRY_S``."""

T = TypeVar("T")


def cause(exc: BaseException) -> str:
    """An exception's first line, passwords hidden: what a one-line store error says of its cause."""
    return hide_passwords((str(exc).strip().splitlines() or [type(exc).__name__])[0])


class StoreWriteError(BenchInputError):
    """The store refused a write for good (after the retries): a server gone, a full disk, a read-only or corrupt
    file. One line naming the store and the cause (exit 2); :class:`harness.session.Run` keeps the cases locally."""

    def __init__(self, message: str) -> None:
        self.cause = message
        super().__init__(message, where="--store")


CONNECTION_LOST = ("server closed the connection", "connection refused", "could not connect", "connection timed out",
                   "terminating connection", "the database system is shutting down",
                   "the database system is starting up", "the database system is in recovery mode",
                   "consuming input failed", "connection is lost", "connection already closed",
                   "no connection to the server", "ssl syscall error", "connection reset")
"""Words of a driver error that mean the connection to the database server was lost or refused (a restart)."""


def transient(exc: BaseException) -> bool:
    """Whether a database error is worth retrying: SQLite's ``database is locked``/busy, PostgreSQL's
    serialization failure (40001), deadlock (40P01) or lock not available (55P03)."""
    if not isinstance(exc, DBAPIError) or isinstance(exc, IntegrityError):
        return False
    state = getattr(exc.orig, "sqlstate", None) or ""
    if state in ("40001", "40P01", "55P03", "57P01", "57P02", "57P03") or state.startswith("08"):
        return True                     # ... and 57P0x / class 08: the server shut down, restarting, or unreachable
    if exc.connection_invalidated:
        return True
    msg = str(exc.orig).lower()
    return isinstance(exc, OperationalError) and ("database is locked" in msg or "database table is locked" in msg
                                                  or "database is busy" in msg
                                                  or any(words in msg for words in CONNECTION_LOST))


def retrying(fn: Callable[..., T]) -> Callable[..., T]:
    """``fn`` (one whole transaction) again, with jittered exponential backoff, while it fails transiently
    (:func:`transient`: a lock, a serialization failure, a server restarting), for up to :data:`RETRY_FOR_S`. An
    IntegrityError propagates (callers use it); any other database error, or the last transient one, becomes
    :class:`StoreWriteError` naming the store (``args[0].shown``: its password hidden) and the cause."""
    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> T:
        deadline, delay = time.monotonic() + RETRY_FOR_S, 0.02
        while True:
            try:
                return fn(*args, **kwargs)
            except IntegrityError:
                raise
            except DBAPIError as exc:
                if not transient(exc) or time.monotonic() + delay > deadline:
                    url = getattr(args[0], "shown", "?") if args else "?"
                    raise StoreWriteError(f"cannot write to results store {url}: {cause(exc.orig)}") from None
                log.debug("%s: %s; retrying in %.2f s", fn.__name__, hide_passwords(str(exc.orig)), delay)
                time.sleep(delay * (0.5 + random.random()))
                delay = min(2 * delay, 1.0)
    return wrapper

