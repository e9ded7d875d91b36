"""The polystore catalog: which engines exist, and which engine holds which object, under which
physical name.

An object is what users name in queries (``orders``). It has one or more *fragments*, each a
physical table or stream in one engine. An object with fragments in several engines is *split*
(BigDAWG's ORDERS: recent rows still in the streaming engine, the rest in PostgreSQL); its rows
are the UNION ALL of its fragments, counted once each. The catalog cannot check that the
fragments are disjoint, and for the usual split object they are not: a sink delivers the
stream's batches into the PostgreSQL table, and until garbage collection drops them from the
stream a batch is in both. The polystore keeps the answer exact (``sstore.polystore.delivered``):
an engine stream delivered by a sink into another fragment contributes only the batches above
the sink's watermark, found in ``sstore.watermarks``. A stream and a PostgreSQL table that no
watermark links are refused unless the object is declared ``disjoint`` (the user's word that
no rows are moved between them).

The catalog persists as a JSON file, written atomically on every change, so ``sstore query`` in
another process sees what a program registered. Engines are recorded by kind and location only:
a PostgreSQL location may be a URL or ``env:NAME`` (the URL is read from the environment when
used), so that passwords need not be written into the catalog.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from enum import StrEnum

from sstore.base.errors import DeclarationError
from sstore.base.files import write_atomically


class EngineKind(StrEnum):
    """The kinds of engine the polystore knows. Each maps to a SQL dialect and a connector."""

    STREAMING = "streaming"   # an sstore engine: its DuckDB state (tables and streams)
    POSTGRES = "postgres"     # a PostgreSQL database, by URL
    SPARK = "spark"           # a Spark session (tables are temporary views)


@dataclass(frozen=True)
class EngineEntry:
    name: str
    kind: EngineKind
    location: str  # streaming: state file path; postgres: URL or env:NAME; spark: master URL


@dataclass(frozen=True)
class Fragment:
    engine: str
    physical: str  # the name inside that engine (``schema.table`` for PostgreSQL)


@dataclass
class CatalogObject:
    name: str
    fragments: list[Fragment]
    columns: dict[str, str] = field(default_factory=dict)  # name -> type, as first seen
    #: the user's word that no rows move between the fragments (no sink links them): a
    #: stream and a table nothing links are refused without it (``delivered``)
    disjoint: bool = False

    @property
    def split(self) -> bool:
        return len({f.engine for f in self.fragments}) > 1

    def engines(self) -> set[str]:
        return {f.engine for f in self.fragments}


class UnknownObjectError(DeclarationError):
    """A query named an object the catalog does not know."""


class Catalog:
    """Engines and objects; persisted to ``path`` (None: in memory only)."""

    def __init__(self, path: str | None = None) -> None:
        self.path = path
        self.engines: dict[str, EngineEntry] = {}
        self.objects: dict[str, CatalogObject] = {}
        #: counts the changes made through this object (each ends in ``save``): what planned
        #: under one version is planned over the same engines and objects
        self.version = 0
        if path is not None and os.path.exists(path):
            self._read(path)

    # ------------------------------------------------------------------ engines
    def add_engine(self, name: str, kind: EngineKind | str, location: str) -> EngineEntry:
        """Record an engine (replacing one of the same name)."""
        entry = EngineEntry(name, EngineKind(kind), location)
        self.engines[name] = entry
        self.save()
        return entry

    def engine(self, name: str) -> EngineEntry:
        try:
            return self.engines[name]
        except KeyError:
            raise DeclarationError(self.missing() or f"no engine {name!r} in the catalog "
                                   f"(known: {', '.join(sorted(self.engines)) or 'none'})"
                                   ) from None

    # ------------------------------------------------------------------ objects
    def register(self, name: str, engine: str, physical: str | None = None,
                 columns: Mapping[str, str] | None = None, *, replace: bool = False,
                 disjoint: bool | None = None) -> None:
        """Say that ``engine`` holds (a fragment of) object ``name`` as ``physical``.

        Registering a second engine's fragment makes the object split; ``replace=True`` makes
        this the object's only fragment (after a migration moved all of it). ``disjoint``:
        record (or withdraw) the user's word that no rows move between the fragments."""
        self.engine(engine)
        key = name.lower()
        fragment = Fragment(engine, physical or name)
        obj = self.objects.get(key)
        if obj is None or replace:
            obj = CatalogObject(key, [fragment], dict(columns or {}))
            self.objects[key] = obj
        elif fragment not in obj.fragments:
            obj.fragments.append(fragment)
        if columns and not obj.columns:
            obj.columns = dict(columns)
        if disjoint is not None:
            obj.disjoint = disjoint
        self.save()

    def register_many(self, engine: str, tables: Iterable[tuple[str, str, dict[str, str]]]
                      ) -> list[str]:
        """Register discovered (name, physical, columns) triples of one engine; return the
        names registered. Discovery never makes a split object: a name another engine already
        holds (a replica, say) stays with it, and this engine's table is reached by its
        engine-qualified name (``engine.table``, see ``lookup``)."""
        names = []
        for name, physical, columns in tables:
            key = name.lower()
            obj = self.objects.get(key)
            if obj is None:
                self.objects[key] = CatalogObject(key, [Fragment(engine, physical)], columns)
            elif engine not in obj.engines():
                continue
            names.append(key)
        self.save()
        return names

    def unregister(self, name: str, engine: str | None = None) -> None:
        """Forget an object, or only its fragment in ``engine``."""
        obj = self.lookup(name)
        if engine is None:
            del self.objects[obj.name]
        else:
            obj.fragments = [f for f in obj.fragments if f.engine != engine]
            if not obj.fragments:
                del self.objects[obj.name]
        self.save()

    def lookup(self, name: str) -> CatalogObject:
        """The object ``name``; or, for ``engine.table`` / ``engine.schema.table`` with a known
        engine, that table of that engine (no registration needed)."""
        obj = self.objects.get(name.lower())
        if obj is None:
            prefix, dot, rest = name.partition(".")
            if dot and prefix in self.engines and rest:
                return CatalogObject(name.lower(), [Fragment(prefix, rest)])
            raise UnknownObjectError(self.missing() or f"no object {name!r} in the catalog "
                                     f"(known: {', '.join(sorted(self.objects)) or 'none'})")
        return obj

    def missing(self) -> str | None:
        """Why nothing is known, when the catalog's file does not exist (yet); else None."""
        if self.path is None or os.path.exists(self.path) or self.engines:
            return None
        return (f"no catalog at {self.path}: create one with `sstore polystore add-postgres "
                f"NAME [URL]` or `sstore polystore add-engine NAME STATE` (or give --catalog / "
                f"SSTORE_CATALOG)")

    def find(self, name: str) -> CatalogObject | None:
        return self.objects.get(name.lower())

    # ------------------------------------------------------------------ persistence
    def to_dict(self) -> dict[str, object]:
        return {
            "engines": [{**asdict(e), "kind": e.kind.value} for e in self.engines.values()],
            "objects": [{"name": o.name, "columns": o.columns,
                         "fragments": [asdict(f) for f in o.fragments],
                         **({"disjoint": True} if o.disjoint else {})}
                        for o in self.objects.values()],
        }

    def save(self) -> None:
        """Write the catalog atomically (temp file + rename): a reader never sees half."""
        self.version += 1
        if self.path is None:
            return
        write_atomically(self.path, json.dumps(self.to_dict(), indent=2))

    def _read(self, path: str) -> None:
        try:
            with open(path, encoding="utf-8") as f:
                data = json.load(f)
            for e in data.get("engines", []):
                self.engines[e["name"]] = EngineEntry(e["name"], EngineKind(e["kind"]),
                                                      e["location"])
            for o in data.get("objects", []):
                self.objects[o["name"]] = CatalogObject(
                    o["name"], [Fragment(f["engine"], f["physical"]) for f in o["fragments"]],
                    dict(o.get("columns", {})), bool(o.get("disjoint", False)))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise DeclarationError(f"catalog {path} is unreadable: {exc}") from exc


def resolve_location(entry: EngineEntry) -> str:
    """The usable location of an engine: ``env:NAME`` is read from the environment."""
    if entry.location.startswith("env:"):
        var = entry.location[4:]
        value = os.environ.get(var)
        if not value:
            raise DeclarationError(f"engine {entry.name!r}: environment variable {var} is not set")
        return value
    return entry.location
