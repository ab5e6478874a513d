"""A throwaway Postgres server from Debian's ``postgresql`` package, for tests and benchmarks.

``initdb`` and ``pg_ctl`` in a fresh temporary directory, listening on 127.0.0.1 and a free
port only (no Unix socket outside the data directory), trust authentication on loopback.
Postgres refuses to run as root, so when we are root the server runs as the unprivileged
``postgres`` user (created by the package) or ``nobody``, through ``runuser``.
``.ci/run`` (``scripts/fear``'s setup) installs the package where it is missing.
"""

from __future__ import annotations

import glob
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

USER = "fear"  # the superuser initdb creates; trust auth on 127.0.0.1 only


class PostgresUnavailable(RuntimeError):
    pass


@dataclass(frozen=True)
class PostgresServer:
    host: str
    port: int
    user: str
    data_dir: Path

    def url(self, db: str) -> str:
        return f"postgresql://{self.user}@{self.host}:{self.port}/{db}"

    def create_database(self, name: str) -> None:
        import psycopg2

        con = psycopg2.connect(host=self.host, port=self.port, user=self.user, dbname="postgres")
        con.autocommit = True
        with con.cursor() as cur:
            cur.execute(f'create database "{name}"')
        con.close()


def postgres_bindir() -> Path:
    """The directory holding initdb and pg_ctl: Debian keeps them off PATH under
    /usr/lib/postgresql/<major>/bin; ``pg_config --bindir`` is not always installed."""
    on_path = shutil.which("initdb")
    if on_path:
        return Path(os.path.realpath(on_path)).parent
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(Path(p).parts[4]))
    if not found:
        raise PostgresUnavailable("initdb not found on PATH nor under /usr/lib/postgresql/*/bin: install Debian's "
                                  "'postgresql' package (apt-get install -y postgresql; scripts/fear does this)")
    return Path(found[-1]).parent


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _as_server_user(cmd: list[str]) -> list[str]:
    if os.geteuid() != 0:
        return cmd
    for name in ("postgres", "nobody"):
        try:
            pwd.getpwnam(name)
        except KeyError:
            continue
        return ["runuser", "-u", name, "--", *cmd]
    raise PostgresUnavailable("running as root and neither user 'postgres' nor 'nobody' exists")


def _server_uid() -> int | None:
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        try:
            return pwd.getpwnam(name).pw_uid
        except KeyError:
            continue
    return None


@contextmanager
def temporary_postgres(max_connections: int = 200, durable: bool = False) -> Iterator[PostgresServer]:
    """Start a server, yield it, always stop it and remove its directory.

    ``durable=False`` (tests) turns fsync off; a benchmark that compares stores keeps it on."""
    bindir = postgres_bindir()
    # Not under pytest's tmp_path: that is 0700 root, which the server user cannot enter.
    root = Path(tempfile.mkdtemp(prefix="fear-pg-"))
    data = root / "data"
    uid = _server_uid()
    if uid is not None:
        os.chown(root, uid, -1)
    port = _free_port()
    log = root / "server.log"
    started = False
    try:
        try:
            subprocess.run(_as_server_user([str(bindir / "initdb"), "-D", str(data), "-U", USER, "--auth=trust",
                                            "-E", "UTF8", "--no-sync"]),
                           check=True, capture_output=True, timeout=120)
            # In tests durability is not under test (the store's files are fsynced; the instance's
            # rows are Dagster's): fsync off keeps the server cheap on a shared 2-core machine.
            options = (f"-c listen_addresses=127.0.0.1 -p {port} -k {data} -c max_connections={max_connections}"
                       + ("" if durable else " -c fsync=off -c synchronous_commit=off -c full_page_writes=off"))
            subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-l", str(log), "-o", options,
                                            "-w", "-t", "60", "start"]),
                           check=True, capture_output=True, timeout=90)
        except subprocess.CalledProcessError as e:
            tail = log.read_text()[-2000:] if log.exists() else ""
            raise PostgresUnavailable(f"{e.cmd} failed: {e.stderr!r} {tail}") from e
        started = True
        deadline = time.monotonic() + 30
        while True:  # pg_ctl -w waits for the socket; make sure TCP answers too
            try:
                with socket.create_connection(("127.0.0.1", port), timeout=1):
                    break
            except OSError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)
        yield PostgresServer("127.0.0.1", port, USER, data)
    finally:
        if started:
            subprocess.run(_as_server_user([str(bindir / "pg_ctl"), "-D", str(data), "-m", "fast", "-w", "stop"]),
                           capture_output=True, timeout=60)
        shutil.rmtree(root, ignore_errors=True)
