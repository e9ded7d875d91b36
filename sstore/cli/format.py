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

from sstore.consumers import ConsumerStatus
from sstore.status import EngineStatus

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


def to_json(rows: Any) -> str:
    """JSON text of an Arrow table (a list of objects) or of plain data (dicts, lists)."""
    data = rows.to_pylist() if isinstance(rows, pa.Table) else rows
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


def status_view(status: EngineStatus) -> RenderableType:
    """The dataflow (procedures with what they read and write), streams and recent errors."""
    header = Text.assemble(("State file ", "bold"), status.path,
                           f"  (durability: {status.durability})")
    flow = Table(title="Dataflow", **TABLE_STYLE)  # type: ignore[arg-type]
    flow.add_column("procedure", no_wrap=True)
    flow.add_column("reads → writes")
    progress = Table(title="Progress", **TABLE_STYLE)  # type: ignore[arg-type]
    progress.add_column("procedure", no_wrap=True)
    progress.add_column("last batch", justify="right")
    progress.add_column("pending", justify="right")
    progress.add_column("on error")
    progress.add_column("state")
    for p in status.procedures:
        flow.add_row(p.name, f"{', '.join(p.inputs)} → {', '.join(p.outputs) or '(tables)'}")
        state = Text(f"halted: {p.halted}", style="red") if p.halted else Text("ok", "green")
        progress.add_row(p.name, str(p.last_batch), str(p.pending), p.on_error, state)
    streams = Table(title="Streams and windows", **TABLE_STYLE)  # type: ignore[arg-type]
    streams.add_column("name", no_wrap=True)
    streams.add_column("kind")
    streams.add_column("last batch", justify="right")
    streams.add_column("rows kept", justify="right")
    for s in status.streams:
        streams.add_row(s.name, s.kind, str(s.last_batch),
                        "" if s.retained_rows is None else str(s.retained_rows))
    parts: list[RenderableType] = [header, flow, progress, streams]
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
