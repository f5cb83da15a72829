"""The coordinator's durable state: studies, devices, contributions, results and the audit log,
behind the :class:`Store` interface (:mod:`.base`); every acknowledged message is committed before
the reply. :func:`open_store` picks the backend from a path or URL: a SQLite file (WAL), the
embedded default, or a PostgreSQL database (:mod:`.postgres`, the ``postgres`` extra), which
several coordinator processes may share. Both run the same logic (:mod:`.sql`) and schema
(:mod:`.schema`)."""

from __future__ import annotations

import os
import re

from fedsketch.server.store.base import ContributionRow, Store, StoreError, StudyRow
from fedsketch.server.store.faults import StoreUnavailable
from fedsketch.server.store.sqlite import SQLiteStore

__all__ = ["ContributionRow", "SQLiteStore", "Store", "StoreError", "StoreUnavailable", "StudyRow",
           "open_store", "sqlite_path"]

_URL = re.compile(r"(?P<scheme>[A-Za-z][A-Za-z0-9+.-]*)://(?P<rest>.*)", re.DOTALL)


def open_store(url_or_path: str | os.PathLike, *, exclusive: bool = False) -> Store:
    """Open (or create) the store at ``url_or_path``; a SQLite file with ``exclusive`` is held
    by this process alone (:class:`SQLiteStore`), a PostgreSQL database ignores it.

    A path-like object, or a string without ``scheme://``, is a SQLite file. URLs follow
    SQLAlchemy's spelling: ``sqlite:///relative.db`` or ``sqlite:////absolute/path.db``, and
    ``postgresql://[user[:password]@][host][:port]/database[?param=value...]`` (or
    ``postgres://``), libpq's URL, so the password may come from ``PGPASSWORD`` or a password
    file instead. Any other scheme, a SQLite URL with a host or without a path, or a PostgreSQL
    URL without psycopg installed is a ValueError (a URL is shown without its password); the
    backend's own refusals (:class:`StoreError`) pass through.
    """
    path = sqlite_path(url_or_path)
    return SQLiteStore(path, exclusive=exclusive) if path is not None else _postgres(os.fspath(url_or_path))


def sqlite_path(url_or_path: str | os.PathLike) -> str | None:
    """The SQLite file ``url_or_path`` names (as :func:`open_store` reads it), or None for a
    PostgreSQL URL; ValueError for any other URL."""
    if not isinstance(url_or_path, str):
        return os.fspath(url_or_path)
    url = _URL.fullmatch(url_or_path)
    if url is None:
        return url_or_path
    scheme = url["scheme"].lower()
    if scheme in ("postgresql", "postgres"):
        return None
    if scheme != "sqlite":
        raise ValueError(f"unsupported store URL scheme {url['scheme']!r}: give a SQLite file path "
                         "(or sqlite:///relative.db, sqlite:////absolute/path.db) or a "
                         "postgresql://host/database URL")
    host, slash, path = url["rest"].partition("/")
    if host or not slash or not path:
        raise ValueError(f"bad SQLite store URL {url_or_path!r}: write sqlite:///relative.db or "
                         "sqlite:////absolute/path.db")
    return path


def _postgres(url: str) -> Store:
    """The PostgreSQL store at ``url``; ValueError if psycopg is not installed."""
    try:
        from fedsketch.server.store.postgres import PostgresStore
    except ImportError as exc:
        raise ValueError(f"a postgresql:// store needs psycopg and psycopg-pool ({exc.name} is not "
                         "installed): pip install 'fedsketch[postgres]'") from None
    return PostgresStore(url)
