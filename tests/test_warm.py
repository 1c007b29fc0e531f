"""tests/warm.py, the warm start of worker scripts, against what `subprocess` gives for the same script started cold."""

import os, signal, subprocess, sys, textwrap, threading
from pathlib import Path

import pytest

import warm

SCRIPT = '''
import atexit, os, sys, time
print(sys.argv[1:], os.getcwd(), os.environ.get('NOTE'), __name__)
print('to stderr', file=sys.stderr)
atexit.register(print, 'atexit ran')
if sys.argv[1] == 'imported':
    print('torch' in sys.modules)
if sys.argv[1] == 'sleep':
    time.sleep(300)
if sys.argv[1] == 'raise':
    raise ValueError('boom')
sys.exit(int(sys.argv[2]) if len(sys.argv) > 2 else 0)
'''


@pytest.fixture
def script(tmp_path):
    path = tmp_path / 'script.py'
    path.write_text(SCRIPT)
    return [sys.executable, str(path)]


@pytest.mark.parametrize('args', [('exit', '0'), ('exit', '3'), ('raise',)])
def test_a_warm_script_ends_as_a_cold_one(script, tmp_path, args):
    "Exit code, output (atexit's too), folder, argv, environment; a traceback ends with the same line."
    given = dict(env={**os.environ, 'NOTE': 'noted'}, cwd=tmp_path, capture_output=True, text=True, timeout=120)
    ran, cold = warm.run(script + list(args), **given), subprocess.run(script + list(args), **given)
    assert (ran.returncode, ran.stdout) == (cold.returncode, cold.stdout), (ran, cold)
    assert ran.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]
    if cold.returncode:
        with pytest.raises(subprocess.CalledProcessError):
            warm.run(script + list(args), check=True, capture_output=True, timeout=120)


def test_a_warm_script_is_its_own_process_and_starts_with_torch_imported(script):
    proc = warm.Popen(script + ['sleep'], stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    assert isinstance(proc, warm.Popen) and os.getpgid(proc.pid) == proc.pid  # its own session, as asked
    assert proc.poll() is None
    os.killpg(proc.pid, signal.SIGKILL)
    assert proc.wait(timeout=60) == -signal.SIGKILL
    out, _ = warm.Popen(script + ['imported'], stdout=subprocess.PIPE, text=True).communicate(timeout=120)
    assert out.splitlines()[-2:] == ['True', 'atexit ran']


def test_a_timeout_kills_the_script(script):
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(script + ['sleep'], timeout=1)


def test_what_an_import_reads_or_another_command_starts_cold(script):
    "torch reads OMP_NUM_THREADS at import, nbtrainer NBTRAINER_DIST_TIMEOUT: a process forked after them cannot."
    for env in ({**os.environ, 'OMP_NUM_THREADS': '2'}, {**os.environ, 'NBTRAINER_DIST_TIMEOUT': '5'}):
        proc = warm.Popen(script + ['imported'], env=env, stdout=subprocess.PIPE, text=True)
        assert type(proc) is subprocess.Popen
        assert proc.communicate(timeout=120)[0].splitlines()[-2:] == ['False', 'atexit ran']
    other = warm.Popen(['true'])
    assert type(other) is subprocess.Popen and other.wait(timeout=60) == 0


def test_an_installed_console_script_starts_warm_and_ends_as_a_cold_one(tmp_path):
    "A script whose first line is this interpreter, as pip writes `.venv/bin/nbtrainer-runs`; the real one too."
    path = tmp_path / 'console-script'
    path.write_text(f'#!{sys.executable}\n{SCRIPT}')
    path.chmod(0o755)
    given = dict(cwd=tmp_path, capture_output=True, text=True, timeout=120)
    for args in (['exit', '3'], ['raise']):
        ran, cold = warm.run([path, *args], **given), subprocess.run([path, *args], **given)
        assert (ran.returncode, ran.stdout) == (cold.returncode, cold.stdout), (ran, cold)
        assert ran.stderr.splitlines()[-1] == cold.stderr.splitlines()[-1]
    assert warm.run([path, 'imported'], **given).stdout.splitlines()[-2:] == ['True', 'atexit ran']  # warm
    runs = Path(sys.executable).parent / 'nbtrainer-runs'
    assert type(warm.Popen([runs, '--help'], stdout=subprocess.DEVNULL)) is warm.Popen
    ran, cold = warm.run([runs, '--help'], **given), subprocess.run([runs, '--help'], **given)
    assert (ran.returncode, ran.stdout, ran.stderr) == (
        cold.returncode,
        cold.stdout,
        cold.stderr,
    ) and 'usage' in ran.stdout


def test_the_environment_compared_is_the_one_the_server_imported_with(script, monkeypatch):
    "A variable changed in this process after the server started is one the server's imports did not read."
    warm.run(script + ['exit', '0'], timeout=120)  # the server is up
    imported_with = dict(os.environ)
    monkeypatch.setenv('OMP_NUM_THREADS', '3')
    assert type(warm.Popen(script + ['exit', '0'])) is subprocess.Popen
    assert type(warm.Popen(script + ['exit', '0'], env=imported_with)) is warm.Popen
    compiled = {**imported_with, 'TORCHINDUCTOR_CACHE_DIR': '/tmp/inductor'}  # torch sets it where it compiled
    assert type(warm.Popen(script + ['exit', '0'], env=compiled)) is warm.Popen


def test_a_request_that_fails_to_send_leaves_the_server_serving(script):
    "A stream that is no open file fails the request in this process; the server goes on to the next one."
    warm.run(script + ['exit', '0'], timeout=120)  # the server is up
    closed = 1000  # a number far above the open ones (a just-closed one is the next socket's)
    with pytest.raises(OSError):
        os.fstat(closed)
    with pytest.raises(OSError) as failed:  # kept, as a test's report keeps it: the Popen stays in its traceback
        warm.Popen(script + ['exit', '0'], stdout=closed)
    assert warm.run(script + ['exit', '3'], timeout=120).returncode == 3, failed


def test_a_server_started_from_a_thread_outlives_the_thread(script, monkeypatch):
    monkeypatch.setattr(warm, '_server', None)  # this test's own server
    codes = []
    thread = threading.Thread(target=lambda: codes.append(warm.run(script + ['exit', '0'], timeout=120).returncode))
    thread.start()
    thread.join()
    server = warm._server
    try:
        assert codes == [0] and warm.run(script + ['exit', '3'], timeout=120).returncode == 3
    finally:
        server.stop()


def test_the_server_ends_with_the_process_that_started_it(script, tmp_path):
    "However that process ends: here by os._exit, which runs no atexit."
    from nbtrainer.testing import wait_for

    code = f"""
        import os, sys
        sys.path.insert(0, {str(Path(warm.__file__).parent)!r})
        import warm
        warm.run({script + ['exit', '0']!r}, timeout=120)
        print(warm._server.process.pid, flush=True)
        os._exit(0)
    """
    done = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    server = int(done.stdout.split()[-1])
    gone = lambda: not os.path.exists(f'/proc/{server}') or ') Z ' in Path(f'/proc/{server}/stat').read_text()
    wait_for(gone, 'the warm server to end with its parent', timeout=60)
