"""The tests' own unixODBC configuration: psqlODBC registered as the SQL Server stand-in's driver
(test support only; docs/sqlserver-standin.md, "How it is reached").

The stand-in is reached through psqlODBC with a few settings of its own (booleans as ``bit``,
SELECTs read through the driver's cursors a page at a time). The product takes no psqlODBC
settings from a connection (its allowlist is Microsoft's driver's, docs/sqlserver.md), so they are
the defaults of a driver entry of the tests' own: ``install()`` writes a private ``odbcinst.ini``
(the system's entries, copied, plus ``[MSSQL stand-in (psqlODBC)]`` loading the system's psqlODBC
library) and points ``ODBCSYSINI`` at it. Child processes (crash tests, spark-submit, Airflow
components, Spark's Python workers) inherit the variable. unixODBC reads it once per process, at
its first use (pyodbc.drivers(), a connection), so ``install()`` runs before that: tests/conftest.py
calls it at import.

Which settings psqlODBC takes from a driver section (psqlODBC 13, ``dlg_specific.c`` of
postgresql-interfaces/psqlodbc, REL-13_02_0000): for a connection string without ``DSN``,
``getDSNinfo`` reads only the driver's defaults, ``getDriversDefaults(<DRIVER value>)`` ->
``get_Ci_Drivers(section, ODBCINST_INI, ...)``, which reads ``Fetch``, ``UseDeclareFetch``,
``BoolsAsChar`` (and ``UniqueIndex``, ``UnknownSizes``, ``Lie``, ``Parse``, the size limits, ...).
``SSLmode``, ``UseServerSidePrepare`` and ``Protocol`` are connection settings, read from the
connection string or a DSN (``ODBC_INI``) only; a driver section's ``Protocol`` lands in a field
nothing reads. The first two are psqlODBC's defaults already (``DEFAULT_SSLMODE`` disable,
``DEFAULT_USESERVERSIDEPREPARE`` 1 in ``dlg_specific.h``); ``Protocol``'s rollback level is left at
its default (statement-level, docs/sqlserver-standin.md). Verified by observation: the server's
statement log shows the declare/fetch cursors and booleans read back as ``bool`` with the settings
here, neither without them (tests/standin/test_sqlserver_standin.py checks both through the product).

psqlODBC looks the section up under the ``DRIVER`` value exactly as written: ``DRIVER={name}``
keeps its braces there, finds no section and silently falls back to the built-in defaults. So a
connection string names this driver unbraced, as the product writes any driver name (one never
contains ``;{}=``).
"""

from __future__ import annotations

import configparser
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path

#: The stand-in's driver, as DAGs and connections name it. Not "... SQL Server ...": the product
#: writes Microsoft's ``SERVER=host,port`` for such a name, psqlODBC takes ``PORT=``.
ODBC_DRIVER = "MSSQL stand-in (psqlODBC)"
#: The psqlODBC entry scripts/bootstrap.sh installs (Debian's odbc-postgresql registers it).
SYSTEM_DRIVER = "PostgreSQL Unicode"
#: Rows per FETCH of the driver's cursors.
CURSOR_ROWS = 2000
#: The stand-in's psqlODBC settings, as its driver section's defaults: booleans as SQL_BIT (pyodbc
#: ``bool``, like SQL Server's ``bit``), and SELECTs read through the driver's declare/fetch cursors,
#: CURSOR_ROWS rows per FETCH (without them psqlODBC holds a query's whole result in the client,
#: where SQL Server's drivers stream it). The proxy unwraps the driver's cursor statements.
DRIVER_DEFAULTS = {"BoolsAsChar": "0", "UseDeclareFetch": "1", "Fetch": str(CURSOR_ROWS)}

_created: Path | None = None  # the directory this process wrote (removed by remove())


def _header(name: str) -> str:
    return f"[{name}]"


def installed_at() -> Path | None:
    """The configuration directory ``ODBCSYSINI`` names if it holds the stand-in's driver (this
    process's or a parent's), else None."""
    directory = os.environ.get("ODBCSYSINI")
    if not directory:
        return None
    ini = Path(directory) / os.environ.get("ODBCINSTINI", "odbcinst.ini")
    try:
        text = ini.read_text()
    except OSError:
        return None
    return Path(directory) if _header(ODBC_DRIVER) in text.splitlines() else None


def _system_files() -> tuple[Path, Path | None]:
    """The driver manager's odbcinst.ini and odbc.ini, as ``odbcinst -j`` reports them (it honours
    a caller's own ODBCSYSINI); Debian's /etc defaults where odbcinst is missing."""
    drivers, sources = Path("/etc/odbcinst.ini"), Path("/etc/odbc.ini")
    if shutil.which("odbcinst"):
        out = subprocess.run(["odbcinst", "-j"], capture_output=True, text=True, timeout=30).stdout
        found = dict(re.findall(r"^(DRIVERS|SYSTEM DATA SOURCES)\.*:\s*(\S.*?)\s*$", out, re.M))
        drivers = Path(found.get("DRIVERS", drivers))
        sources = Path(found.get("SYSTEM DATA SOURCES", sources))
    return drivers, sources if sources.is_file() else None


def _library(odbcinst_ini: str) -> str | None:
    """The ``Driver`` (library) of the system's psqlODBC entry, as written there: unixODBC resolves
    a bare file name (Debian's ``psqlodbcw.so``) in its own driver directory, the same from any
    odbcinst.ini, so no architecture's path is written here."""
    parser = configparser.ConfigParser(
        interpolation=None, strict=False, allow_no_value=True, comment_prefixes=("#", ";")
    )
    parser.optionxform = str  # type: ignore[assignment,method-assign]
    try:
        parser.read_string(odbcinst_ini)
    except configparser.Error:
        return None
    section = parser[SYSTEM_DRIVER] if parser.has_section(SYSTEM_DRIVER) else None
    library = section.get("Driver", "").strip() if section is not None else ""
    return library or None


def install() -> Path | None:
    """Points ``ODBCSYSINI`` at the tests' configuration, writing it on first use (a child process
    finds its parent's). Call before the process's first ODBC use. None (nothing changed) where
    psqlODBC is not installed: ``check()`` then says what to do."""
    global _created
    existing = installed_at()
    if existing is not None:
        return existing
    drivers, sources = _system_files()
    system = drivers.read_text() if drivers.is_file() else ""
    library = _library(system)
    if library is None:
        return None  # no psqlODBC: check() says to run scripts/bootstrap.sh
    directory = Path(tempfile.mkdtemp(prefix="cdc-test-odbc-"))
    entry = [
        _header(ODBC_DRIVER),
        f"Description=psqlODBC ({SYSTEM_DRIVER}) for the tests' SQL Server stand-in, from tests/support/odbc.py",
        f"Driver={library}",
        *(f"{key}={value}" for key, value in DRIVER_DEFAULTS.items()),
    ]
    # psqlODBC reads its logging switches from the section named after itself ("PostgreSQL
    # Unicode"), which Debian ships with CommLog=1: a log file per process in /tmp. Off in this copy.
    system = re.sub(r"(?im)^(\s*(?:CommLog|Debug)\s*=).*$", r"\g<1>0", system)
    (directory / "odbcinst.ini").write_text(system.rstrip("\n") + "\n\n" + "\n".join(entry) + "\n")
    if sources is not None:  # system data sources stay as they were
        shutil.copyfile(sources, directory / "odbc.ini")
    os.environ["ODBCSYSINI"] = str(directory)
    os.environ["ODBCINSTINI"] = "odbcinst.ini"
    _created = directory
    return directory


def check() -> None:
    """Raises unless this process's driver manager sees the stand-in's driver."""
    import pyodbc

    if ODBC_DRIVER in pyodbc.drivers():
        return
    if installed_at() is None:
        raise RuntimeError(
            f"psqlODBC is not registered as {SYSTEM_DRIVER!r} in {_system_files()[0]}, so the SQL Server stand-in "
            "has no driver: run scripts/bootstrap.sh (it installs odbc-postgresql)"
        )
    raise RuntimeError(
        f"ODBC driver {ODBC_DRIVER!r} is not visible to this process: unixODBC read its configuration before "
        "ODBCSYSINI pointed at the tests' (tests.support.odbc.install() must run before the first ODBC use; "
        "tests/conftest.py calls it at import)"
    )


def remove() -> None:
    """Deletes the configuration this process wrote (at the end of the test session)."""
    global _created
    if _created is not None:
        shutil.rmtree(_created, ignore_errors=True)
        _created = None
