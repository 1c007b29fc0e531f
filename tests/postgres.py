"""A real PostgreSQL server for the tests (Debian's `postgresql` package, installed by tools/test.sh as Chromium is): made
in a temporary folder, listening on 127.0.0.1 at a free port, stopped at the end; one per pytest process. As root the
server runs as the `postgres` user, which Debian's package makes (PostgreSQL refuses to run as root)."""

import glob, itertools, os, shutil, socket, subprocess, tempfile
from pathlib import Path


def binaries():
    "The folder of initdb and pg_ctl (Debian keeps them under /usr/lib/postgresql/<version>/bin), or None."
    found = sorted(glob.glob('/usr/lib/postgresql/*/bin/initdb'), key=lambda p: int(p.split('/')[4]))
    if found:
        return Path(found[-1]).parent
    initdb = shutil.which('initdb')
    return Path(initdb).parent if initdb else None


def _free_port():
    with socket.socket() as s:
        s.bind(('127.0.0.1', 0))
        return s.getsockname()[1]


class Server:
    "A PostgreSQL server of its own; `database()` makes a new, empty database on it and gives its URL."

    def __init__(self):
        bin_dir = binaries()
        if bin_dir is None:
            raise RuntimeError("PostgreSQL is not installed: apt-get install postgresql (tools/test.sh does, as root)")
        self.folder = Path(tempfile.mkdtemp(prefix='nbtrainer-pg-'))
        self.as_user = ['runuser', '-u', 'postgres', '--'] if os.geteuid() == 0 else []
        if self.as_user:
            shutil.chown(self.folder, 'postgres')
        self.bin, self.count = bin_dir, itertools.count()
        data = self.folder / 'data'
        self._run('initdb', '-D', data, '-A', 'trust', '-U', 'postgres', '--no-sync', '-E', 'UTF8')
        self.port = self._start(data)
        self.url = f'postgresql://postgres@127.0.0.1:{self.port}'

    def _start(self, data, tries=5):
        """Start the server on a free port and return the port. PostgreSQL cannot be given port 0, and a port picked
        before the server binds it can be taken meanwhile by any socket on the machine: then another port."""
        for attempt in range(tries):
            port, log = _free_port(), self.folder / f'log{attempt}'
            options = f'-p {port} -k {self.folder} -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200'
            try:
                self._run('pg_ctl', '-D', data, '-o', options, '-l', log, '-w', '-t', '120', 'start')
                return port
            except RuntimeError:
                if attempt == tries - 1 or 'Address already in use' not in log.read_text():
                    raise

    def _run(self, tool, *args):
        done = subprocess.run(
            [*self.as_user, str(self.bin / tool), *map(str, args)], capture_output=True, text=True, timeout=300
        )
        if done.returncode:
            raise RuntimeError(f'{tool} failed: {done.stdout[-2000:]}{done.stderr[-2000:]}')

    def database(self):
        "A new, empty database on the server: its URL."
        import psycopg

        name = f'db{os.getpid()}_{next(self.count)}'
        with psycopg.connect(f'{self.url}/postgres', autocommit=True) as con:
            con.execute(f'CREATE DATABASE {name}')
        return f'{self.url}/{name}'

    def stop(self):
        try:
            self._run('pg_ctl', '-D', self.folder / 'data', '-m', 'immediate', 'stop')
        finally:
            shutil.rmtree(self.folder, ignore_errors=True)
