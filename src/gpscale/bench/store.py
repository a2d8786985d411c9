"""Benchmark results in SQLite: one row per run, appended; the schema is versioned.

A run is identified by (protocol, protocol_version, method, options, dataset, split, seed); ``--resume`` skips
the identities that already have a successful row. A file of an older schema is brought up to date when opened if
the newer one only adds columns (:data:`MIGRATIONS`); any other mismatch is an error.
"""
from __future__ import annotations

import json
import sqlite3
from contextlib import closing
from pathlib import Path

__all__ = ["SCHEMA_VERSION", "COLUMNS", "IDENTITY", "ResultsStore", "identity"]

SCHEMA_VERSION = 7

# name -> SQLite type; the order is the table's column order
COLUMNS: dict[str, str] = {
    "protocol": "TEXT", "protocol_version": "INTEGER",
    "method": "TEXT", "options": "TEXT",  # options: JSON, sorted keys
    "dataset": "TEXT", "split": "INTEGER", "seed": "INTEGER",
    "n_train": "INTEGER", "n_test": "INTEGER", "d": "INTEGER",
    "status": "TEXT", "error": "TEXT",  # status: 'ok', 'error' or 'skipped' (a peer's code absent; error: the note)
    "rmse": "REAL", "nlpd": "REAL", "coverage": "REAL",  # on standardised y; coverage of the central 95%
    "calibration": "TEXT",  # JSON {"levels": [...], "empirical": [...]}
    "rmse_original": "REAL",  # RMSE in the units of y
    "accuracy": "REAL",  # classification: the share of test labels predicted (rmse and coverage are then empty)
    "train_seconds": "REAL", "seconds_per_epoch": "REAL", "predict_seconds": "REAL", "epochs": "INTEGER",
    "peak_memory_mb": "REAL",
    "reused_training_of": "TEXT",  # the method whose trained model this run refitted (posterior options only)
    "fitted_method": "TEXT",  # the method that method key 'auto' chose
    "steps": "INTEGER",  # optimiser steps taken (Adam steps or L-BFGS iterations)
    "seconds_per_step": "REAL",  # the epochs' seconds over their steps (papers' seconds per iteration)
    "converged": "INTEGER",  # training to convergence: 1 if the plateau rule ended it, 0 at the cap; NULL: epochs
    "dtype": "TEXT", "device": "TEXT",
    "processes": "INTEGER",  # data-parallel processes that trained the model (NULL: one)
    "gpscale_version": "TEXT", "torch_version": "TEXT", "gpytorch_version": "TEXT",
    "machine": "TEXT", "cpu": "TEXT", "cores": "INTEGER",
    "date": "TEXT", "git_commit": "TEXT",
    "command": "TEXT",  # the `gpscale bench ...` command line that ran it
}
# schema version -> the columns added by the next version
MIGRATIONS: dict[int, tuple[str, ...]] = {1: ("reused_training_of",), 2: ("accuracy",), 3: ("processes",),
                                          4: ("fitted_method", "steps", "converged"), 5: ("seconds_per_step",),
                                          6: ("command",)}
IDENTITY = ("protocol", "protocol_version", "method", "options", "dataset", "split", "seed")


class ResultsStore:
    """An SQLite file of runs. Creating it on a new path makes the table; an existing file must have the same
    schema version."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with closing(self._connect()) as db, db:
            db.execute("CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT)")
            row = db.execute("SELECT value FROM meta WHERE key = 'schema_version'").fetchone()
            if row is None:
                db.execute("INSERT INTO meta VALUES ('schema_version', ?)", (str(SCHEMA_VERSION),))
            else:
                self._migrate(db, int(row[0]))
            columns = ", ".join(f"{name} {kind}" for name, kind in COLUMNS.items())
            db.execute(f"CREATE TABLE IF NOT EXISTS runs (id INTEGER PRIMARY KEY AUTOINCREMENT, {columns})")

    def _migrate(self, db: sqlite3.Connection, version: int) -> None:
        if not all(v in MIGRATIONS for v in range(version, SCHEMA_VERSION)) or version > SCHEMA_VERSION:
            raise ValueError(f"{self.path} has results schema {version}, this gpscale writes {SCHEMA_VERSION}: "
                             "use a new results file.")
        for v in range(version, SCHEMA_VERSION):
            for name in MIGRATIONS[v]:
                db.execute(f"ALTER TABLE runs ADD COLUMN {name} {COLUMNS[name]}")
        db.execute("UPDATE meta SET value = ? WHERE key = 'schema_version'", (str(SCHEMA_VERSION),))

    def _connect(self) -> sqlite3.Connection:
        try:
            db = sqlite3.connect(self.path)
            db.execute("SELECT 1 FROM sqlite_master LIMIT 1")
        except sqlite3.DatabaseError as err:
            raise ValueError(f"{self.path} is not a gpscale results file ({err}).") from err
        db.row_factory = sqlite3.Row
        return db

    def append(self, record: dict) -> None:
        """Add one run; keys outside :data:`COLUMNS` are an error, missing ones are stored as NULL."""
        unknown = set(record) - set(COLUMNS)
        if unknown:
            raise ValueError(f"Unknown result fields: {sorted(unknown)}")
        values = [_encode(record.get(name)) for name in COLUMNS]
        with closing(self._connect()) as db, db:
            db.execute(f"INSERT INTO runs ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})", values)

    def runs(self, protocol: str | None = None) -> list[dict]:
        """Every run (optionally of one protocol) in insertion order, JSON fields decoded."""
        query, args = "SELECT * FROM runs", ()
        if protocol is not None:
            query, args = query + " WHERE protocol = ?", (protocol,)
        with closing(self._connect()) as db:
            rows = db.execute(query + " ORDER BY id", args).fetchall()
        return [_decode(dict(row)) for row in rows]

    def completed(self, protocol: str, version: int) -> set[tuple]:
        """Identities of the successful runs of a protocol version."""
        with closing(self._connect()) as db:
            rows = db.execute(
                f"SELECT {', '.join(IDENTITY)} FROM runs WHERE status = 'ok' AND protocol = ? AND protocol_version = ?",
                (protocol, version)).fetchall()
        return {tuple(row) for row in rows}


def identity(record: dict) -> tuple:
    return tuple(_encode(record[name]) for name in IDENTITY)


def _encode(value):
    if isinstance(value, (dict, list)):
        return json.dumps(value, sort_keys=True)
    return value


def _decode(row: dict) -> dict:
    for name in ("options", "calibration"):
        if row.get(name):
            row[name] = json.loads(row[name])
    return row
