"""How the ``sstore`` command line shows things: Arrow tables, engine status, voter results.

Kept apart from ``sstore.cli.app`` so that the commands stay a list of steps and every command
formats values the same way (``value_text``).
"""

from __future__ import annotations

import csv
import datetime
import decimal
import io
import json
from collections.abc import Mapping, Sequence
from typing import Any

import pyarrow as pa
from rich import box
from rich.console import Group, RenderableType
from rich.table import Table
from rich.text import Text

from sstore.storage.consumers import ConsumerStatus
from sstore.storage.status import EngineStatus

TABLE_STYLE = {"title_justify": "left", "title_style": "bold", "header_style": "bold",
               "box": box.SIMPLE_HEAD, "pad_edge": False}


def value_text(value: Any) -> str:
    """One cell as text: no value is empty, times read as ISO, the rest as Python prints it."""
    if value is None:
        return ""
    if isinstance(value, datetime.datetime):
        return value.isoformat(sep=" ")
    if isinstance(value, float):
        return f"{value:.6g}"
    return str(value)


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.date, datetime.time, datetime.timedelta)):
        return value.isoformat() if hasattr(value, "isoformat") else str(value)
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, bytes):
        return value.hex()
    return str(value)


def unique_names(names: Sequence[str]) -> list[str]:
    """Column names as JSON object keys: a repeated name gets ``_1``, ``_2``... (skipping names
    the answer already has), in column order. ``SELECT a.id, b.id`` answers two columns named
    ``id``; as keys of one object the second replaced the first, and a column was lost."""
    taken = set(names)
    seen: set[str] = set()
    out = []
    for name in names:
        unique, n = name, 0
        while unique in seen:
            n += 1
            unique = f"{name}_{n}"
            if unique in taken:  # another column's own name: never taken over
                unique = name
        seen.add(unique)
        out.append(unique)
    return out


def to_json(rows: Any) -> str:
    """JSON text of an Arrow table (a list of objects, one key per column: repeated names
    made unique, ``unique_names``) or of plain data (dicts, lists)."""
    if isinstance(rows, pa.Table):
        names = unique_names(rows.column_names)
        columns = [rows.column(i).to_pylist() for i in range(rows.num_columns)]
        data: Any = [dict(zip(names, row)) for row in zip(*columns)] if columns else \
            [{} for _ in range(rows.num_rows)]
    else:
        data = rows
    return json.dumps(data, indent=2, default=_json_default)


def to_csv(table: pa.Table) -> str:
    """CSV text with a header row; a null is an empty field."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.column_names)
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    for row in zip(*columns):
        writer.writerow([value_text(v) for v in row])
    return out.getvalue()


def arrow_table(table: pa.Table, title: str | None = None) -> Table:
    """A rich table of an Arrow table's rows; numbers align right."""
    out = Table(title=title, title_justify="left", header_style="bold")
    for field in table.schema:
        numeric = pa.types.is_integer(field.type) or pa.types.is_floating(field.type) \
            or pa.types.is_decimal(field.type)
        out.add_column(field.name, justify="right" if numeric else "left")
    columns = [table.column(i).to_pylist() for i in range(table.num_columns)]
    for row in zip(*columns):
        out.add_row(*(value_text(v) for v in row))
    return out


def when_text(iso: str | None, now: datetime.datetime | None = None) -> str:
    """A commit time as local clock time and how long ago: ``09:01:56 (3 s ago)``; a day or
    more ago with its date; empty when unknown."""
    if not iso:
        return ""
    at = datetime.datetime.fromisoformat(iso)
    now = now or datetime.datetime.now(datetime.UTC)
    ago = max(0.0, (now - at).total_seconds())
    local = at.astimezone()
    clock = local.strftime("%H:%M:%S") if ago < 86_400 else local.strftime("%Y-%m-%d %H:%M")
    for limit, unit, size in ((120, "s", 1), (7_200, "min", 60), (172_800, "h", 3_600)):
        if ago < limit:
            return f"{clock} ({ago / size:.0f} {unit} ago)"
    return f"{clock} ({ago / 86_400:.0f} days ago)"


def status_view(status: EngineStatus) -> RenderableType:
    """The dataflow (procedures in dataflow order, with what they read and write), progress
    with the time of each last commit, streams, consumers, recent errors; and, when the status
    came from a serving engine, its live numbers."""
    header = Text.assemble(("State file ", "bold"), status.path,
                           f"  (durability: {status.durability})")
    flow = Table(title="Dataflow", **TABLE_STYLE)  # type: ignore[arg-type]
    flow.add_column("procedure", no_wrap=True)
    flow.add_column("reads → writes")
    progress = Table(title="Progress", **TABLE_STYLE)  # type: ignore[arg-type]
    progress.add_column("procedure", no_wrap=True)
    progress.add_column("last batch", justify="right")
    progress.add_column("pending", justify="right")
    progress.add_column("last commit")
    progress.add_column("on error")
    progress.add_column("state")
    progress.add_column("versions")
    for p in status.procedures:
        flow.add_row(p.name, f"{', '.join(p.inputs)} → {', '.join(p.outputs) or '(tables)'}")
        state = Text(f"halted: {p.halted}", style="red") if p.halted else Text("ok", "green")
        progress.add_row(p.name, str(p.last_batch), str(p.pending),
                         when_text(p.last_commit_at), p.on_error, state,
                         "\n".join(f"v{v['version']} from batch {v['from_batch']}: "
                                    f"{v['change']}" for v in p.versions))
    streams = Table(title="Streams and windows", **TABLE_STYLE)  # type: ignore[arg-type]
    streams.add_column("name", no_wrap=True)
    streams.add_column("kind")
    streams.add_column("last batch", justify="right")
    streams.add_column("rows kept", justify="right")
    streams.add_column("versions")
    for s in status.streams:
        streams.add_row(s.name, s.kind, str(s.last_batch),
                        "" if s.retained_rows is None else str(s.retained_rows),
                        "\n".join(f"v{v['version']} from batch {v['first_batch']}: "
                                   f"{v['change']}" for v in s.versions))
    parts: list[RenderableType] = [header]
    if status.live is not None:
        parts.append(live_header(status.live))
    parts += [flow, progress, streams]
    if status.live is not None and status.live.get("sinks"):
        parts.append(sinks_view(status.live["sinks"]))
    pressure = status.backpressure or (status.live or {}).get("backpressure")
    if pressure:
        parts.append(backpressure_view(pressure))
    if status.event_windows:
        parts.append(event_windows_view(status.event_windows))
    if status.consumers:
        parts.append(consumers_view(status.consumers))
    if status.errors:
        errors = Table(title="Recent errors", **TABLE_STYLE)  # type: ignore[arg-type]
        for name in ("at", "procedure", "batch", "action", "error"):
            errors.add_column(name)
        for e in status.errors:
            errors.add_row(value_text(e["at"]), e["procedure"], value_text(e["batch_id"]),
                           e["action"], e["error"])
        parts.append(errors)
    else:
        parts.append(Text("No errors recorded.", style="green"))
    return Group(*parts)


def live_header(live: Mapping[str, Any]) -> RenderableType:
    """Where a live status came from, its rates, and what it could not read."""
    lines = Text.assemble(("Live ", "bold green"),
                          f"from the running engine (PID {live.get('pid')}) at "
                          f"{live.get('url')}, {live.get('taken_at', '')}")
    rates = ", ".join(f"{p['name']} {p['batches_per_s']:.1f} batches/s" +
                      (f" ({p['te_ms_avg']:.1f} ms/TE)" if p.get("te_ms_avg") else "")
                      for p in live.get("procedures", []))
    if rates:
        lines.append(f"\nRates over the last seconds: {rates}")
    for note in (live.get("note"), live.get("skipped")):
        if note:
            lines.append(f"\n{note}", style="yellow")
    return lines


def sinks_view(sinks: Sequence[Mapping[str, Any]]) -> RenderableType:
    """Sinks of a live engine: how far each target is, how far behind, how fast."""
    table = Table(title="Sinks", **TABLE_STYLE)  # type: ignore[arg-type]
    for name, justify in (("sink", "left"), ("stream", "left"), ("watermark", "right"),
                          ("lag", "right"), ("rows/s", "right"), ("retries", "right"),
                          ("state", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for k in sinks:
        lag = f"{k['lag_batches']:,} batches"
        if k.get("lag_seconds") is not None:
            lag += f", {k['lag_seconds']:.1f} s"
        state = Text(f"halted: {k['halted']}", style="red") if k.get("halted") else \
            Text(f"retrying: {k['last_error']}", style="yellow") if k.get("last_error") else \
            Text("running" if k.get("running") else "not attached", style="green")
        table.add_row(k["name"], k["stream"], str(k["watermark"]), lag,
                      f"{k['rows_per_s']:,.0f}", str(k["retries"]), state)
    return table


def backpressure_view(report: Mapping[str, Any]) -> RenderableType:
    """Readers' lag against their bounds (``sstore.execution.backpressure``) and whether ingest
    waits."""
    def bound(c: Mapping[str, Any]) -> str:
        parts = [f"{c['bound_batches']:,} batches" if c["bound_batches"] is not None else "",
                 _bytes(c["bound_bytes"]) if c["bound_bytes"] is not None else ""]
        return ", ".join(p for p in parts if p) or "none"

    waiting = report["waiting_ingests"]
    title = (f"Backpressure: {waiting} ingest(s) waiting now" if waiting
             else "Backpressure: ingest flows") + \
        (f"; {report['blocked_seconds']:.1f} s blocked, {report['timeouts']} timed out, "
         f"{report['stalls']} refused (stalled) so far; timeout {report['timeout']:g} s")
    table = Table(title=title, **TABLE_STYLE)  # type: ignore[arg-type]
    for name, justify in (("reader", "left"), ("kind", "left"), ("reads", "left"),
                          ("lag", "right"), ("bound", "right"), ("blocked s", "right"),
                          ("state", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in report["consumers"]:
        state = Text(f"halted: {c['halted']}", style="red") if c.get("halted") else \
            Text(f"over its bound{', ingest waiting' if c['waiting_ingests'] else ''}",
                 style="yellow" if c["running"] else "red") if c["over"] else \
            Text("ok", style="green")
        table.add_row(c["consumer"], c["kind"], ", ".join(c["streams"]),
                      f"{c['lag_batches']:,} batches, {c['lag_rows']:,} rows, "
                      f"~{_bytes(c['lag_bytes'])}", bound(c), f"{c['blocked_seconds']:.1f}",
                      state)
    return table


def event_windows_view(windows: Sequence[Mapping[str, Any]]) -> RenderableType:
    """Each event-time window's watermark and how many rows it took in and found late."""
    table = Table(title="Event-time windows", **TABLE_STYLE)  # type: ignore[arg-type]
    for name, justify in (("window", "left"), ("source", "left"), ("watermark", "left"),
                          ("rows in", "right"), ("late", "right")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for w in windows:
        mark = w.get("watermark_at") or ("none yet" if w["watermark"] is None
                                         else str(w["watermark"]))
        table.add_row(w["name"], str(w["source"]), mark, f"{w['rows_in']:,}",
                      f"{w['rows_late']:,}")
    return table


def _bytes(n: int) -> str:
    """``n`` bytes in B, KiB, MiB or GiB."""
    if n < 1024:
        return f"{n:,} B"
    size, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB"):
        if size < 1024:
            break
        size, unit = size / 1024, bigger
    return f"{size:,.1f} {unit}"


def consumers_view(consumers: Sequence[ConsumerStatus]) -> RenderableType:
    """External consumers: what each holds, how far it is, and the gaps it accepted."""
    if not consumers:
        return Text("No consumers hold any stream.")
    table = Table(title="Consumers (the engine keeps their batches until acknowledged)",
                  **TABLE_STYLE)  # type: ignore[arg-type]
    for name, justify in (("consumer", "left"), ("stream", "left"), ("acknowledged", "right"),
                          ("waiting", "right"), ("accepted gaps", "left"), ("state", "left")):
        table.add_column(name, justify=justify)  # type: ignore[arg-type]
    for c in consumers:
        gaps = ", ".join(f"{g['first_batch']}..{g['last_batch']}" for g in c.gaps)
        state = Text(f"halted: {c.halted}", style="red") if c.halted else Text("ok", "green")
        table.add_row(c.consumer, c.stream, str(c.acknowledged),
                      f"{c.pending_batches:,} batches" + (f" from {c.pending_from}"
                                                          if c.pending_from else ""),
                      Text(gaps, style="yellow") if gaps else "", state)
    return table


def leaderboard_view(table: pa.Table, window_rows: int) -> Table:
    """The voter leaderboard: active contestants by votes, then the removed ones."""
    out = Table(title="Leaderboard", title_justify="left", header_style="bold",
                caption=f"trending: votes among the last {window_rows:,} valid votes; "
                        f"out at N: removed when N valid votes had been counted",
                caption_justify="left")
    out.add_column("#", justify="right")
    out.add_column("contestant", no_wrap=True)
    out.add_column("votes", justify="right")
    out.add_column("trending", justify="right")
    out.add_column("status", no_wrap=True)
    for row in table.to_pylist():
        removed = row["removed_at_votes"]
        status = Text("in the show", style="green") if removed is None else \
            Text(f"out at {removed:,}")
        out.add_row(str(row["rank"]), f"{row['name']} ({row['contestant']})",
                    f"{row['votes']:,}", f"{row['trending']:,}", status,
                    style=None if removed is None else "dim")
    return out


def plural(n: int, word: str) -> str:
    """``1 batch``, ``2 batches``, ``1,000 votes``."""
    suffix = "" if n == 1 else "es" if word.endswith(("s", "ch", "sh", "x")) else "s"
    return f"{n:,} {word}{suffix}"


def run_summary(result: Mapping[str, Any]) -> Text:
    """What a voter run did and how fast, in a few lines."""
    rejected = result["rejected"]
    total_rejected = sum(rejected.values())
    reasons = ", ".join(f"{reason.replace('_', ' ')} {n:,}" for reason, n in rejected.items())
    lines = Text()
    if result["skipped_batches"]:
        lines.append(f"Skipped {plural(result['skipped_batches'], 'batch')} "
                     f"({plural(result['skipped_votes'], 'vote')}) already in the state file.\n")
    lines.append(f"Votes: {result['votes']:,} new in {plural(result['batches'], 'batch')}; "
                 f"{result['valid']:,} valid, {total_rejected:,} rejected ({reasons}).\n")
    lines.append("Throughput: ", style="bold")
    lines.append(f"{result['votes_per_s']:,.0f} votes/s, "
                 f"{result['executions_per_s']:,.0f} transaction executions/s "
                 f"({plural(result['executions'], 'execution')} in {result['elapsed_s']:.2f} s, "
                 f"batches of {result['batch_size']:,}).")
    return lines
