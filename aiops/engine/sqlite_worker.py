"""One SQLite connection, driven so that the event loop never waits on a long statement.

Statements run in the order they were issued, on one connection. Reads, and writes of more than a
row, go through one worker thread, so the event loop never waits on a long query.

Small writes (one row: add a message, open a session, an audit record) are committed on the loop
itself when the worker thread is idle: the first of a loop iteration at once, the ones issued after
it in the same iteration together at the start of the next (one transaction, each write in its own
savepoint so one that fails is undone alone). When the worker is busy, the batch is queued behind
what it has and committed there. A one-row commit costs the loop less than handing it over does:
the put that wakes the thread, the thread taking the GIL from the loop, the answer's way back
through the loop's self-pipe. On an idle 2-core machine a streamed proxy request cost 18-24 % less
CPU in all with writes inline, and its loop thread ~10 % less (docs/PERFORMANCE.md, issue 27,
"18:00-19:30 UTC"); an earlier A/B on a machine at load 8-11, where the second core was the
only one free, had found the thread cheaper, which is why `inline_writes=False` (every batch on
the thread) is kept and tested. A read flushes the writes issued before it first. Commits never
fsync: with WAL and synchronous=NORMAL only checkpoints do, and automatic checkpoints are off;
the worker runs them every CHECKPOINT_EVERY commits, so a commit on the loop never waits for the
disk.

The worker is one thread fed by a plain queue, its answers handed back to the loop with one
`call_soon_threadsafe` per job: a ThreadPoolExecutor's submit, its concurrent future and the
asyncio future wrapped around it cost several times as much per hand-over, about 5 % of the
loop thread under the proxy benchmark (docs/PERFORMANCE.md, issue 27).

Each write commits before its coroutine returns (WAL + synchronous=NORMAL survives process
crashes; only power loss may drop the last commits).
"""

from __future__ import annotations

import asyncio
import logging
import queue
import sqlite3
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

T = TypeVar("T")

# A job for the worker thread: what to run on the connection, and what to call with its value or
# its exception (on the worker thread; it hands the outcome to the loop itself).
# (`opening`: the job opens or closes the connection, so runs without one.)
_Job = tuple[Callable[[sqlite3.Connection], Any], Callable[[Any, BaseException | None], None], bool]

CHECKPOINT_EVERY = 500  # commits between WAL checkpoints (run on the worker thread)

log = logging.getLogger(__name__)


class StoreError(Exception):
    pass


def _connect(path: Path) -> sqlite3.Connection:
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(path, check_same_thread=False, isolation_level=None, timeout=10)
    conn.row_factory = sqlite3.Row
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=NORMAL")
    conn.execute("PRAGMA foreign_keys=ON")
    return conn


def _deliver(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]]) -> None:
    for fut, value, err in results:
        if fut.done():
            continue  # its caller was cancelled; the write is committed all the same
        if err is not None:
            fut.set_exception(err)
        else:
            fut.set_result(value)


def _to_loop(loop: asyncio.AbstractEventLoop, fn: Callable[[Any, BaseException | None], None],
             value: Any, err: BaseException | None) -> None:
    """`fn(value, err)` on `loop`, from the worker thread."""
    try:
        loop.call_soon_threadsafe(fn, value, err)
    except RuntimeError:
        pass  # the loop is closed: nobody is waiting for the answer any more


class SQLiteWorker:
    """Async access to one SQLite connection driven by a single worker thread. `prepare` runs on
    the connection once it is open (the schema's migrations). With `inline_writes` (the default),
    small writes are committed on the loop itself when the worker is idle (see above); without,
    every batch of them on the worker thread."""

    def __init__(self, path: Path, prepare: Callable[[sqlite3.Connection], Any] | None = None, *,
                 inline_writes: bool = True) -> None:
        self.path = path
        self.inline_writes = inline_writes
        self._prepare = prepare
        self._conn: sqlite3.Connection | None = None
        self._jobs: queue.SimpleQueue[_Job | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._stopped = False  # the thread was told to end: nothing may be queued after that
        self._conn_lock = threading.Lock()  # held by whoever is using the connection
        self._count_lock = threading.Lock()
        self._queued = 0  # operations handed to the worker that it has not started
        self._batch: list[tuple[Callable[[sqlite3.Connection], Any], asyncio.Future[Any]]] = []
        self._flush_handle: asyncio.Handle | None = None
        self._writes = 0  # commits since the last checkpoint

    async def run(self, fn: Callable[[sqlite3.Connection], T], *, small: bool = False) -> T:
        """`fn(connection)`, in issue order, on the worker thread; with `small` (a one-row write)
        group-committed with the writes issued alongside it (or inline, see `inline_writes`).
        Resolves once `fn`'s write is committed."""
        if small:
            if self.inline_writes and self._flush_handle is None and self._queued == 0 and self._conn_lock.acquire(blocking=False):
                # The first write of this loop iteration, nothing queued before it: now, inline.
                # Later ones in the same iteration wait for the group commit this schedules.
                try:
                    out = self._use(lambda conn: self.tx(conn, lambda: fn(conn)))
                finally:
                    self._conn_lock.release()
                self._flush_handle = asyncio.get_running_loop().call_soon(self._flush)
                self._maybe_checkpoint()
                return out
            return await self._write(fn)
        self._flush()  # writes issued earlier go first
        out = await self._submit(fn)
        self._maybe_checkpoint()
        return out

    def _submit(self, fn: Callable[[sqlite3.Connection], T], *, opening: bool = False) -> asyncio.Future[T]:
        """`fn(connection)` queued for the worker thread; a future of the loop for its outcome."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()

        def settle(value: Any, err: BaseException | None) -> None:
            if fut.done():
                return  # its caller was cancelled
            if err is not None:
                fut.set_exception(err)
            else:
                fut.set_result(value)

        self._queue(fn, lambda value, err: _to_loop(loop, settle, value, err), opening=opening)
        return fut

    def _queue(self, fn: Callable[[sqlite3.Connection], Any],
               done: Callable[[Any, BaseException | None], None], *, opening: bool = False) -> None:
        """Hand `fn` to the worker thread (started on first use); `done` is called there with
        its outcome. After close, `done` hears at once that the store is closed."""
        if self._stopped:
            done(None, StoreError("store is closed"))
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._work, name="aiops-store", daemon=True)
            self._thread.start()
        self._enqueue()
        self._jobs.put((fn, done, opening))

    def _work(self) -> None:
        while (job := self._jobs.get()) is not None:
            fn, done, opening = job
            try:
                value, err = self._call(fn, True, opening=opening), None
            except BaseException as e:  # noqa: BLE001 - the caller gets it
                value, err = None, e
            try:
                done(value, err)
            except Exception:  # noqa: BLE001 - the worker must outlive a loop that went away
                log.exception("store: an answer could not be handed back")

    def _write(self, fn: Callable[[sqlite3.Connection], T]) -> asyncio.Future[T]:
        """Group commit: one-row writes issued in the same loop iteration share one transaction,
        committed at the start of the next; each caller's future resolves once it is committed."""
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[T] = loop.create_future()
        self._batch.append((fn, fut))
        if self._flush_handle is None:
            self._flush_handle = loop.call_soon(self._flush)
        return fut

    def _flush(self) -> None:
        if self._flush_handle is not None:
            self._flush_handle.cancel()
            self._flush_handle = None
        batch, self._batch = self._batch, []
        if not batch:
            return
        # Every way this can fail ends in the batch's futures: a writer that is never answered
        # would hold its turn open for good (turns wait for their commits even when cancelled).
        if self.inline_writes and self._queued == 0 and self._conn_lock.acquire(blocking=False):
            try:
                if self._queued == 0:  # nothing issued earlier is still waiting: now, in order
                    try:
                        results = self._use(lambda conn: self._commit_batch(conn, batch))
                    except Exception as e:  # noqa: BLE001 - "store is closed": every writer hears it
                        results = [(fut, None, e) for _, fut in batch]
                    _deliver(results)
                    self._maybe_checkpoint()
                    return
            finally:
                self._conn_lock.release()
        if self._conn is None:  # closed (its thread ends with it): nothing can take the batch
            _deliver([(fut, None, StoreError("store is closed")) for _, fut in batch])
            return
        loop = asyncio.get_running_loop()

        def deliver(results: list[tuple[asyncio.Future[Any], Any, BaseException | None]] | None,
                    err: BaseException | None) -> None:
            _deliver(results if results is not None else [(fut, None, err) for _, fut in batch])
            self._maybe_checkpoint()

        # One hand-over each way for the whole batch.
        self._queue(lambda conn: self._commit_batch(conn, batch),
                    lambda results, err: _to_loop(loop, deliver, results, err))

    def _commit_batch(self, conn: sqlite3.Connection, batch: list[tuple[Callable[[sqlite3.Connection], Any],
                                                                     asyncio.Future[Any]]]
                      ) -> list[tuple[asyncio.Future[Any], Any, BaseException | None]]:
        """Run every write of a batch in one transaction, each in its own savepoint so that one
        that fails is undone alone; a failed COMMIT fails them all."""
        out: list[tuple[asyncio.Future[Any], Any, BaseException | None]] = []
        if len(batch) == 1:
            # Alone in its transaction, a write needs no savepoint: two statements fewer for the
            # commit of a quiet hour's every write.
            fn, fut = batch[0]
            try:
                conn.execute("BEGIN IMMEDIATE")
                value = fn(conn)
                conn.execute("COMMIT")
            except BaseException as e:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                return [(fut, None, e)]
            self._writes += 1
            return [(fut, value, None)]
        try:
            conn.execute("BEGIN IMMEDIATE")  # may time out on a lock another process holds
            for fn, fut in batch:
                conn.execute("SAVEPOINT w")
                try:
                    value = fn(conn)
                except Exception as e:  # noqa: BLE001 - the caller gets it
                    if not conn.in_transaction:
                        # SQLite undid the whole transaction itself (a full disk, an I/O error):
                        # nothing of the batch is committed, and each writer hears the real cause.
                        return [(f, None, e) for _, f in batch]
                    conn.execute("ROLLBACK TO w")
                    conn.execute("RELEASE w")
                    out.append((fut, None, e))
                    continue
                conn.execute("RELEASE w")
                out.append((fut, value, None))
            conn.execute("COMMIT")
        except BaseException as e:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            return [(fut, None, e) for _, fut in batch]
        self._writes += 1
        return out

    def _enqueue(self) -> None:
        with self._count_lock:
            self._queued += 1

    def _call(self, fn: Callable[[sqlite3.Connection], T], _queued: bool = False, *, opening: bool = False) -> T:
        if opening:  # open and close make or drop the connection (close takes the lock itself)
            with self._count_lock:
                self._queued -= 1
            return fn(None)  # type: ignore[arg-type]
        with self._conn_lock:
            if _queued:
                with self._count_lock:
                    self._queued -= 1
            return self._use(fn)

    def _use(self, fn: Callable[[sqlite3.Connection], T]) -> T:
        if self._conn is None:
            raise StoreError("store is closed")
        return fn(self._conn)

    def _maybe_checkpoint(self) -> None:
        if self._writes < CHECKPOINT_EVERY or self._conn is None:
            return
        self._writes = 0

        def checkpoint(conn: sqlite3.Connection) -> None:
            conn.execute("PRAGMA wal_checkpoint(PASSIVE)")

        def report(_: None, e: BaseException | None) -> None:  # on the worker thread
            if e is not None:
                log.warning("WAL checkpoint failed: %s", e)

        self._queue(checkpoint, report)

    async def open(self) -> None:
        def _open() -> None:
            self._conn = _connect(self.path)
            if self._prepare is not None:
                self._prepare(self._conn)
            # Checkpoints are the only fsyncs; the worker runs them (see _maybe_checkpoint), so a
            # commit made inline on the event loop never waits for the disk.
            self._conn.execute("PRAGMA wal_autocheckpoint=0")

        await self._submit(lambda _conn: _open(), opening=True)

    async def close(self) -> None:
        if self._stopped:
            return
        self._flush()

        def _close() -> None:
            with self._conn_lock:
                if self._conn is not None:
                    self._conn.close()
                    self._conn = None

        await self._submit(lambda _conn: _close(), opening=True)
        self._stopped = True
        if self._thread is not None:
            self._jobs.put(None)
            # It ends right after the close above: a join that returns at once.
            self._thread.join()

    def tx(self, conn: sqlite3.Connection, fn: Callable[[], T]) -> T:
        if conn.in_transaction:
            return fn()  # inside a group commit: its savepoint makes this write all or nothing
        conn.execute("BEGIN IMMEDIATE")
        try:
            out = fn()
            conn.execute("COMMIT")
            self._writes += 1
            return out
        except BaseException:
            conn.execute("ROLLBACK")
            raise

    @property
    def connection(self) -> sqlite3.Connection | None:
        """The connection (None while closed); for tests that set up the environment."""
        return self._conn
