"""A writer process for the fenced-writer tests (``tests/migrators/test_fenced_writers.py``).

    python -m tests.fence_worker STATE URL [--output]

Opens STATE (stream ``events``, one BIGINT column), makes a sink into PostgreSQL table
``events`` and answers one line per command read from stdin. With ``--output`` the sink
delivers stream ``out`` instead, the output of a procedure copying ``events`` and declared
without columns: it has no schema until the procedure first produces it (a sink that starts
before that has no target to create and nothing to fingerprint), into table ``out``.

- ``ingest N``: ingest batch N (rows N*10 .. N*10+2), run what it triggers -> ``OK``
- ``deliver``: move what is pending (``run_pending``) -> ``OK <rows>`` or ``ERR <Class>: <text>``
- ``quit``
"""

from __future__ import annotations

import sys
from typing import Any

from migrators import StreamToPostgres
from sstore import Engine


def main(state: str, url: str, output: bool) -> None:
    with Engine(state) as engine:
        engine.stream("events", {"id": "BIGINT"})
        if output:
            @engine.procedure(input="events", output="out")
            def copy(tx: Any, batch: Any) -> Any:
                return tx.sql("SELECT id FROM batch")

        stream = "out" if output else "events"
        sink = StreamToPostgres(engine, stream, url, stream)
        print("READY", flush=True)
        for line in sys.stdin:
            command, *args = line.split()
            if command == "quit":
                break
            try:
                if command == "ingest":
                    n = int(args[0])
                    engine.ingest("events", [(n * 10 + i,) for i in range(3)], batch_id=n)
                    engine.run_until_idle()
                    print("OK", flush=True)
                elif command == "deliver":
                    print(f"OK {sink.run_pending()}", flush=True)
            except Exception as exc:  # the parent reads the outcome
                print(f"ERR {type(exc).__name__}: {' '.join(str(exc).split())}", flush=True)
        sink.close()


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], "--output" in sys.argv[3:])
