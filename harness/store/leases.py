"""Run leases: one driver per run at a time.

A lease (``run_leases``, schema 5) is taken when a run is created or resumed and released when its execution ends.
Another ``--resume`` of a run whose lease is held by a live driver is refused in one line (:class:`RunBusyError`). A
lease is stale, and taken over, when its holder is gone: on the same host, its process (pid and start time) no
longer exists; from another host, its heartbeat (every :data:`LEASE_HEARTBEAT_S`) is older than :data:`LEASE_TTL_S`.
"""
from __future__ import annotations

import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

import psutil
import sqlalchemy as sa
from sqlalchemy.exc import IntegrityError

from harness.contract.errors import BenchInputError
from harness.contract.secrets import hide_passwords
from harness.store.retry import retrying
from harness.store.schema import run_leases, timestamp

__all__ = ["LEASE_HEARTBEAT_S", "LEASE_TTL_S", "Lease", "RunBusyError", "RunLeases", "lease_row"]

log = logging.getLogger("bench")

LEASE_HEARTBEAT_S = 15.0
"""How often a driver renews the leases it holds."""
LEASE_TTL_S = 120.0
"""A lease held from another host whose heartbeat is older than this is stale (its driver is presumed gone)."""


class RunBusyError(BenchInputError):
    """Another live driver holds the run's lease (a second concurrent ``--resume``): refused, exit 2."""


@dataclass(frozen=True)
class Lease:
    """Who holds a run: ``owner`` (host/pid/random), its host, pid and start time, and its last heartbeat."""

    run_id: str
    owner: str
    host: str
    pid: int
    pid_started: float
    acquired_at: str
    heartbeat: float

    def live(self, now: float | None = None) -> bool:
        """Whether the holder may still be running: on this host, its process (same pid, same start time)
        exists and is not this process; elsewhere, its heartbeat is younger than LEASE_TTL_S."""
        if self.host != socket.gethostname():
            return (time.time() if now is None else now) - self.heartbeat < LEASE_TTL_S
        if self.pid == os.getpid():
            return False                          # this process: a lease it left behind is its own to take
        try:
            proc = psutil.Process(self.pid)
            return abs(proc.create_time() - self.pid_started) < 1.0 and proc.status() != psutil.STATUS_ZOMBIE
        except psutil.NoSuchProcess:
            return False
        except psutil.AccessDenied:
            return True

    def describe(self) -> str:
        seen = max(0.0, time.time() - self.heartbeat)
        return f"pid {self.pid} on {self.host} (since {self.acquired_at}, last seen {seen:.0f} s ago)"


def lease_row(run_id: str) -> dict[str, Any]:
    """A new lease on ``run_id`` held by this process (a ``run_leases`` row)."""
    pid = os.getpid()
    try:
        started = psutil.Process(pid).create_time()
    except psutil.Error:
        started = 0.0
    host = socket.gethostname()
    return {"run_id": run_id, "owner": f"{host[:80]}/{pid}/{uuid.uuid4().hex[:12]}", "host": host, "pid": pid,
            "pid_started": started, "acquired_at": timestamp(), "heartbeat": time.time()}


class RunLeases:
    """The leases one store handle holds, kept renewed by a heartbeat thread while it holds any.

    ``writer``: the store's engine for write transactions; ``shown``: the store's URL with its password hidden (what
    a refused write names); ``present``: whether the store has the ``run_leases`` table (a store opened to read may
    predate it: then no run has a lease)."""

    def __init__(self, engine: sa.Engine, writer: sa.Engine, shown: str, present: bool = True) -> None:
        self.engine = engine
        self.writer = writer
        self.shown = shown
        self.present = present
        self.thread: threading.Thread | None = None
        """The heartbeat thread, while this handle holds a lease."""
        self._held: dict[str, str] = {}          # run_id -> owner of the leases this handle holds
        self._held_lock = threading.Lock()

    def claim(self, run_id: str) -> None:
        """Become the one driver of ``run_id`` (to resume it), or raise :class:`RunBusyError` (one line) if a
        live driver holds it. A stale lease (see the module docstring) is taken over, atomically: of two
        processes taking over the same stale lease, one wins and the other sees the winner's live lease."""
        for _ in range(10):
            row = lease_row(run_id)
            try:
                self._insert(row)
                self.hold(run_id, row["owner"])
                return
            except IntegrityError:
                pass
            held = self.get(run_id)
            if held is None:
                continue                        # released in between: insert again
            if held.live():
                raise RunBusyError(f"run {run_id} is being measured by {held.describe()}: let it finish, or start "
                                   "a new run without --resume", where="--resume")
            if self._take_over(held, row):
                if (held.host, held.pid) != (row["host"], row["pid"]):
                    log.warning("run %s: took over the lease of %s, gone", run_id, held.describe())
                self.hold(run_id, row["owner"])
                return
        raise RunBusyError(f"run {run_id}: its lease kept changing hands; try again", where="--resume")

    @retrying
    def _insert(self, row: dict[str, Any]) -> None:
        with self.writer.begin() as conn:
            conn.execute(run_leases.insert().values(**row))

    @retrying
    def _take_over(self, stale: Lease, row: dict[str, Any]) -> bool:
        """Replace the lease ``stale`` by ``row`` only if it is still exactly ``stale`` (no one renewed or took it)."""
        with self.writer.begin() as conn:
            done = conn.execute(run_leases.update().where(
                run_leases.c.run_id == stale.run_id, run_leases.c.owner == stale.owner,
                run_leases.c.heartbeat == stale.heartbeat).values(**row))
            return done.rowcount == 1

    def release(self, run_id: str) -> None:
        """Give up this handle's lease on ``run_id`` (nothing if it holds none); never raises (a lease left
        behind goes stale when this process ends)."""
        with self._held_lock:
            owner = self._held.pop(run_id, None)
        if owner is None:
            return
        try:
            self._delete(run_id, owner)
        except Exception as exc:  # noqa: BLE001 — the run's results are stored; the lease will go stale
            log.warning("could not release the lease on run %s: %s", run_id, hide_passwords(str(exc)))

    @retrying
    def _delete(self, run_id: str, owner: str) -> None:
        with self.writer.begin() as conn:
            conn.execute(run_leases.delete().where(run_leases.c.run_id == run_id, run_leases.c.owner == owner))

    def get(self, run_id: str) -> Lease | None:
        """The lease on ``run_id``, if any (live or stale)."""
        if not self.present:
            return None
        with self.engine.connect() as conn:
            row = conn.execute(sa.select(run_leases).where(run_leases.c.run_id == run_id)).mappings().first()
        return Lease(**dict(row)) if row is not None else None

    def hold(self, run_id: str, owner: str) -> None:
        """Remember a lease this handle holds (``owner``: its row's) and keep it renewed by the heartbeat thread."""
        with self._held_lock:
            self._held[run_id] = owner
            if self.thread is None or not self.thread.is_alive():
                self.thread = threading.Thread(target=self._renew_held, name="bench-lease-heartbeat", daemon=True)
                self.thread.start()

    def _renew_held(self) -> None:
        """Every LEASE_HEARTBEAT_S, renew the leases this handle holds; end when it holds none."""
        while True:
            time.sleep(LEASE_HEARTBEAT_S)
            with self._held_lock:
                held = dict(self._held)
                if not held:
                    self.thread = None
                    return
            for run_id, owner in held.items():
                try:
                    renewed = self._renew(run_id, owner)
                except Exception as exc:  # noqa: BLE001 — a missed heartbeat is not fatal; the next may pass
                    log.warning("could not renew the lease on run %s: %s", run_id, hide_passwords(str(exc)))
                    continue
                if not renewed:
                    log.warning("run %s: its lease was taken over by another driver", run_id)
                    with self._held_lock:
                        if self._held.get(run_id) == owner:
                            del self._held[run_id]

    @retrying
    def _renew(self, run_id: str, owner: str) -> bool:
        with self.writer.begin() as conn:
            done = conn.execute(run_leases.update().where(run_leases.c.run_id == run_id, run_leases.c.owner == owner)
                                .values(heartbeat=time.time()))
            return done.rowcount == 1
