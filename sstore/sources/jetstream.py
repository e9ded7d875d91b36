"""NATS JetStream: a subject of a JetStream stream, exactly once, a run of sequence numbers per
batch. The Kafka-like source here: a durable log with sequence numbers (offsets), consumers with
acknowledgements.

Positions are the JetStream **stream sequence** numbers; a batch is what one fetch returned, a
contiguous run of the subject's messages ``first``..``last`` (messages of other subjects may sit
between them), and its batch-id is ``last``. The state file's position is the truth
(``sstore.sources.base``); the broker's consumer is only how messages are delivered:

- At every start the durable pull consumer (``sstore_<stream>`` unless named) is deleted and
  created again to deliver from the committed position + 1 (only a consumer this source made,
  marked by its description: another one of that name is refused, never deleted). Messages
  handed to a process that died are therefore not waited for (no gap while their ack timeout
  runs), and nothing before the position comes back.
- Deliveries are checked to be contiguous (the consumer's own delivery sequence has no hole);
  a hole (a delivery lost on a broken connection, a broker restart) drops the range read so
  far and recreates the consumer at the committed position + 1. So a range never skips a
  message.
- A message at or below the committed position (a redelivery after the ack timeout, or after
  a crash between commit and acknowledgement) is acknowledged and skipped.
- Acknowledgements (explicit, one per message) are sent only after the engine committed the
  batch; a lost ack only means a redelivery, skipped as above.

Each message is a JSON object naming the stream's columns (an absent key is NULL), or an
array of such objects (several rows, all or none), and is stored by the engine's input value
rule (``sstore.base.rows``). A message that is not such an
object, or whose values the rule refuses, is a **dead letter**: recorded (payload and reason)
in ``sstore_sources.dead_letters`` in the same transaction as the batch that skips it, and
acknowledged with it. It never blocks the stream and is never lost.

A user must not purge the JetStream stream or delete messages that were not taken yet: a start
that finds the stream's first sequence above the committed position + 1 refuses (a gap).
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Coroutine
from typing import Any, TypeVar

import nats
import nats.errors
import nats.js.errors
import pyarrow as pa
from nats.aio.client import Client
from nats.aio.msg import Msg
from nats.js import JetStreamContext
from nats.js.api import AckPolicy, ConsumerConfig, DeliverPolicy

from sstore.base.errors import SchemaError
from sstore.base.rows import to_arrow
from sstore.engine import Engine
from sstore.sources.base import Chunk, DeadLetter, SourceError

log = logging.getLogger("sstore.sources")
T = TypeVar("T")

#: messages per fetch (one batch)
BATCH = 500
#: seconds the broker waits for an acknowledgement before it delivers a message again
ACK_WAIT = 30.0
#: seconds of a broker that cannot be reached before the source gives up
MAX_OUTAGE = 60.0


class NatsSource:
    """The messages of ``subject`` in the JetStream stream ``js_stream`` (module docstring)."""

    kind = "nats"

    def __init__(self, url: str, js_stream: str, subject: str, *, durable: str | None = None,
                 batch: int = BATCH, ack_wait: float = ACK_WAIT,
                 max_outage: float = MAX_OUTAGE) -> None:
        self.url = url
        self.js_stream = js_stream
        self.subject = subject
        self.origin = f"{js_stream}:{subject}"
        self.durable = durable
        self.batch = batch
        self.ack_wait = ack_wait
        self.max_outage = max_outage
        #: messages delivered more than once that were skipped (already committed)
        self.redelivered = 0
        #: consumers recreated after a hole in the deliveries
        self.resyncs = 0
        self._loop = asyncio.new_event_loop()
        self._nc: Client | None = None
        self._js: JetStreamContext | None = None
        self._sub: JetStreamContext.PullSubscription | None = None
        self._schema: pa.Schema | None = None
        self._stream = ""
        self._position = 0
        self._delivered = 0  # the consumer's last delivery sequence received
        self._pending = 1
        self._failing_since: float | None = None

    def _run(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._loop.run_until_complete(coro)

    # ------------------------------------------------------------------ start
    def start(self, engine: Engine, stream: str, position: int) -> None:
        self._stream = stream
        self._schema = engine.schema(stream)
        self._position = position
        if self.durable is None:
            self.durable = f"sstore_{stream}"
        self._run(self._connect())
        self._run(self._check_gap())
        self._run(self._recreate())

    async def _connect(self) -> None:
        try:
            self._nc = await nats.connect(self.url, connect_timeout=5, max_reconnect_attempts=-1,
                                          reconnect_time_wait=0.2, allow_reconnect=True)
        except (TimeoutError, OSError, nats.errors.Error) as exc:
            raise SourceError(f"cannot reach NATS at {self.url}: {exc}") from None
        self._js = self._nc.jetstream()

    async def _check_gap(self) -> None:
        assert self._js is not None
        try:
            info = await self._js.stream_info(self.js_stream)
        except nats.js.errors.NotFoundError:
            raise SourceError(f"no JetStream stream {self.js_stream!r} at {self.url}") from None
        first, last = info.state.first_seq, info.state.last_seq
        if last < self._position:
            raise SourceError(
                f"JetStream stream {self.js_stream!r} ends at sequence {last}, but stream "
                f"{self._stream!r} took up to {self._position} from it: it was deleted and "
                f"created again (its sequence numbers start over). Nothing was read; drop the "
                f"source (`sstore source drop`) to feed the stream from the new one")
        if last > self._position and first > self._position + 1:
            raise SourceError(
                f"JetStream stream {self.js_stream!r} starts at sequence {first}, but stream "
                f"{self._stream!r} took up to {self._position} only: sequences "
                f"{self._position + 1}..{first - 1} were removed before they were taken (a "
                f"purge, or the stream's limits). They are lost to this source; nothing was "
                f"read. Look at what they held, then drop the source (`sstore source drop`) "
                f"and feed the stream again if that is right")

    async def _recreate(self) -> None:
        """The consumer, delivering from the committed position + 1 (module docstring)."""
        assert self._js is not None and self.durable is not None
        if self._sub is not None:
            await self._sub.unsubscribe()
            self._sub = None
        mark = f"sstore source of stream {self._stream}"
        try:
            info = await self._js.consumer_info(self.js_stream, self.durable)
        except nats.js.errors.NotFoundError:
            pass
        else:
            if info.config.description != mark:
                raise SourceError(
                    f"JetStream stream {self.js_stream!r} has a consumer {self.durable!r} that "
                    f"this source did not make (its description is "
                    f"{info.config.description!r}): it is not deleted; name another one "
                    f"with --durable")
            await self._js.delete_consumer(self.js_stream, self.durable)
        config = ConsumerConfig(
            durable_name=self.durable, description=mark, filter_subject=self.subject,
            deliver_policy=DeliverPolicy.BY_START_SEQUENCE, opt_start_seq=self._position + 1,
            ack_policy=AckPolicy.EXPLICIT, ack_wait=self.ack_wait, max_ack_pending=-1)
        await self._js.add_consumer(self.js_stream, config)
        self._sub = await self._js.pull_subscribe_bind(self.durable, self.js_stream)
        self._delivered = 0

    # ------------------------------------------------------------------ read
    def read(self, timeout: float) -> Chunk | None:
        try:
            msgs = self._run(self._fetch(timeout))
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            self._outage(exc)
            return None
        self._failing_since = None
        if msgs is None:
            return None
        return self._chunk(msgs)

    async def _fetch(self, timeout: float) -> list[Msg] | None:
        """The next messages after the position, contiguous; None when none came."""
        assert self._sub is not None
        try:
            msgs = await self._sub.fetch(self.batch, timeout=max(timeout, 0.05))
        except nats.errors.TimeoutError:
            self._pending = 0
            return None
        fresh: list[Msg] = []
        for msg in msgs:
            meta = msg.metadata
            if meta.sequence.consumer != self._delivered + 1:
                log.warning("%s: delivery %s came after %s: a delivery was lost; reading "
                            "again from sequence %s", self.origin, meta.sequence.consumer,
                            self._delivered, self._position + 1)
                self.resyncs += 1
                await self._recreate()
                return None
            self._delivered = meta.sequence.consumer
            self._pending = meta.num_pending
            if meta.sequence.stream <= self._position:
                self.redelivered += 1
                await msg.ack()  # committed before: only the ack was missing
                continue
            fresh.append(msg)
        return fresh or None

    def _outage(self, exc: BaseException) -> None:
        now = time.monotonic()
        if self._failing_since is None:
            self._failing_since = now
        if now - self._failing_since > self.max_outage:
            raise SourceError(f"NATS at {self.url} failed for {self.max_outage:g} s: "
                              f"{type(exc).__name__}: {exc}") from exc
        log.warning("%s: %s: %s; trying again", self.origin, type(exc).__name__, exc)
        self._pending = 1
        time.sleep(0.1)

    def _chunk(self, msgs: list[Msg]) -> Chunk:
        """Decode the messages by the input value rule; the ones it refuses are dead letters
        (a message is the unit: one row, or the rows of an array, all or none)."""
        assert self._schema is not None
        decoded: list[tuple[Msg, list[dict[str, Any]]]] = []
        dead: list[DeadLetter] = []
        for msg in msgs:
            rows, error = self._decode(msg.data)
            if error is not None:
                dead.append(DeadLetter(msg.metadata.sequence.stream, error, msg.data,
                                       msg.subject))
            else:
                decoded.append((msg, rows))
        what = f"stream {self._stream!r}"
        try:
            table = to_arrow([row for _, rows in decoded for row in rows], self._schema, what)
        except SchemaError:  # find the messages the rule refuses, one by one
            good = []
            for msg, rows in decoded:
                try:
                    to_arrow(rows, self._schema, what)
                except SchemaError as exc:
                    dead.append(DeadLetter(msg.metadata.sequence.stream, str(exc), msg.data,
                                           msg.subject))
                else:
                    good += rows
            table = to_arrow(good, self._schema, what)
        dead.sort(key=lambda d: d.position)
        return Chunk(msgs[0].metadata.sequence.stream, msgs[-1].metadata.sequence.stream,
                     table, dead=dead, token=msgs)

    def _decode(self, data: bytes) -> tuple[list[dict[str, Any]], str | None]:
        """A message's rows: a JSON object is one row, an array of objects its rows."""
        assert self._schema is not None
        try:
            value = json.loads(data)
        except (ValueError, UnicodeDecodeError) as exc:
            return [], f"not JSON: {exc}"
        values = value if isinstance(value, list) else [value]
        rows = []
        for item in values:
            if not isinstance(item, dict):
                return [], (f"not a JSON object (or an array of objects) but "
                            f"{type(item).__name__}")
            unknown = sorted(set(item) - set(self._schema.names))
            if unknown:
                return [], f"unknown column(s) {unknown}; the stream has {self._schema.names}"
            rows.append({name: item.get(name) for name in self._schema.names})
        return rows, None

    def caught_up(self) -> bool:
        return self._pending == 0

    # ------------------------------------------------------------------ acknowledge
    def acknowledge(self, chunk: Chunk) -> None:
        msgs = chunk.token
        assert isinstance(msgs, list)
        self._position = chunk.last
        try:
            self._run(self._ack(msgs))
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            log.warning("%s: acknowledging %s..%s failed (%s); they come again and are "
                        "skipped", self.origin, chunk.first, chunk.last, exc)

    async def _ack(self, msgs: list[Msg]) -> None:
        for msg in msgs:
            await msg.ack()
        assert self._nc is not None
        await self._nc.flush(timeout=5)

    def close(self) -> None:
        try:
            if self._nc is not None and not self._nc.is_closed:
                self._run(self._nc.close())  # acks were flushed; nothing else to wait for
        except (TimeoutError, nats.errors.Error, OSError) as exc:
            log.warning("%s: closing the connection: %s", self.origin, exc)
        finally:
            self._loop.close()
