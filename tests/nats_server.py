"""A private nats-server with JetStream for the tests (the Debian package ``nats-server``;
``scripts/system.sh`` installs it): its own port and store directory, so a test may kill and
restart it without touching the machine's broker."""

from __future__ import annotations

import asyncio
import json
import shutil
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import nats
from nats.js.api import StreamConfig


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


class NatsServer:
    """``start``/``kill`` a nats-server on ``port`` storing in ``store``."""

    def __init__(self, store: Path, port: int | None = None) -> None:
        binary = shutil.which("nats-server") or "/usr/sbin/nats-server"
        if not Path(binary).exists():
            raise AssertionError("nats-server is missing: scripts/system.sh installs it "
                                 "(Debian package nats-server)")
        self.binary = binary
        self.store = store
        self.port = port or free_port()
        self.url = f"nats://127.0.0.1:{self.port}"
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        self.proc = subprocess.Popen(
            [self.binary, "-js", "-a", "127.0.0.1", "-p", str(self.port), "-sd",
             str(self.store)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            try:
                socket.create_connection(("127.0.0.1", self.port), timeout=0.2).close()
                return
            except OSError:
                time.sleep(0.05)
        raise AssertionError(f"nats-server did not listen on {self.port}")

    def kill(self) -> None:
        if self.proc is not None:
            self.proc.kill()
            self.proc.wait()
            self.proc = None


def run(coro: Any) -> Any:
    return asyncio.run(coro)


async def _publish(url: str, js_stream: str, subject: str, payloads: list[bytes],
                   create: bool) -> list[int]:
    nc = await nats.connect(url)
    js = nc.jetstream()
    if create:
        await js.add_stream(StreamConfig(name=js_stream, subjects=[f"{js_stream}.>"]))
    seqs = []
    for payload in payloads:
        ack = await js.publish(subject, payload)
        seqs.append(ack.seq)
    await nc.close()
    return seqs


def publish(url: str, js_stream: str, subject: str, payloads: list[Any], *,
            create: bool = False) -> list[int]:
    """Publish (JSON-encoding what is not bytes); returns the stream sequence numbers."""
    data = [p if isinstance(p, bytes) else json.dumps(p).encode() for p in payloads]
    return list(run(_publish(url, js_stream, subject, data, create)))


async def _consumer(url: str, js_stream: str, durable: str) -> tuple[int, int]:
    nc = await nats.connect(url)
    info = await nc.jetstream().consumer_info(js_stream, durable)
    await nc.close()
    return info.ack_floor.stream_seq or 0, info.num_ack_pending or 0


def consumer_acks(url: str, js_stream: str, durable: str) -> tuple[int, int]:
    """(the consumer's ack floor as a stream sequence, messages delivered and not acked)."""
    return tuple(run(_consumer(url, js_stream, durable)))  # type: ignore[return-value]
