"""The ICU workload fed from NATS JetStream (sstore.sources), as a child process for
tests/sources/test_source_icu.py.

    python -m tests.icu_nats_worker PATH POSTGRES_URL NATS_URL

The arrival batches of ``tests.icu_worker.generated()`` were published to the JetStream
stream ``ICU`` (subject ``ICU.readings``), one message per batch (a JSON array of its
readings), so a message's sequence number is the batch-id a direct feed would give it. This
takes them with ``sstore.sources.feed`` (one message per batch) into the ICU dataflow with its
four warehouse sinks, waits until PostgreSQL has everything and writes the same result file as
``tests.icu_worker``; then prints DONE. The test kills it anywhere and compares.
"""

from __future__ import annotations

import json
import sys

from sstore import Engine
from sstore.sources import feed
from sstore.sources.jetstream import NatsSource
from sstore.workloads import icu
from sstore.workloads.icu import dataflow, run
from tests.icu_worker import warehouse


def main(path: str, url: str, nats_url: str) -> None:
    engine = Engine(path)
    icu.declare(engine)
    sinks = run.make_sinks(engine, url)
    for sink in sinks:
        sink.attach()
    feed(engine, NatsSource(nats_url, "ICU", "ICU.readings", batch=1), dataflow.READINGS,
         until_idle=True, poll=0.3)
    for sink in sinks:
        if not sink.flush(timeout=120):
            raise SystemExit(f"sink {sink.table} did not catch up: {sink.last_error}")
    result = {"warehouse": warehouse(url), "counts": run.counts(engine),
              "engine_alerts": [[r["alert_id"], r["patient"], r["kind"]]
                                for r in run.alert_rows(engine)]}
    for sink in sinks:
        sink.detach()
    with open(path + ".result.json", "w") as f:
        json.dump(result, f, default=str)
    engine.close()
    print("DONE", flush=True)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2], sys.argv[3])
