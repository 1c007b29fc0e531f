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
    import torch, nbtrainer.distributed
    print(torch.get_num_threads(), nbtrainer.distributed.DEFAULT_TIMEOUT)
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
    assert out.splitlines()[-3] == 'True' and out.splitlines()[-1] == 'atexit ran'


def test_a_timeout_kills_the_script(script):
    with pytest.raises(subprocess.TimeoutExpired):
        warm.run(script + ['sleep'], timeout=1)


def test_what_an_import_reads_is_read_under_the_scripts_own_environment(script):
    "torch reads OMP_NUM_THREADS at import, nbtrainer NBTRAINER_DIST_TIMEOUT: each setting has a server of its own."
    for change in ({'OMP_NUM_THREADS': '2'}, {'NBTRAINER_DIST_TIMEOUT': '5'}, {'OMP_NUM_THREADS': '2'}):
        given = dict(env={**os.environ, **change}, capture_output=True, text=True, timeout=120)
        ran, cold = warm.run(script + ['imported'], **given), subprocess.run(script + ['imported'], **given)
        threads = min(int(given['env']['OMP_NUM_THREADS']), os.cpu_count())  # torch takes at most one a core
        timeout = float(given['env'].get('NBTRAINER_DIST_TIMEOUT', 300))
        assert ran.stdout.splitlines()[-3:-1] == ['True', f'{threads} {timeout}']  # warm, and read what it was given
        assert cold.stdout.splitlines()[-3:-1] == ['False', f'{threads} {timeout}']
    compiled = {**os.environ, 'TORCHINDUCTOR_CACHE_DIR': '/tmp/inductor'}  # torch sets it where it compiled
    servers = len(warm._servers)
    warm.run(script + ['exit', '0'], env=compiled, timeout=120)
    assert len(warm._servers) == servers  # the cache folder is read as torch compiles, not as it is imported
    other = warm.Popen(['true'])
    assert type(other) is subprocess.Popen and other.wait(timeout=60) == 0  # another command starts cold


def test_a_change_to_this_processs_environment_is_read_by_the_next_script(script, monkeypatch):
    "A variable changed here after a server started: the next script's imports read the new value, as a cold one's."
    monkeypatch.setenv('OMP_NUM_THREADS', '1')
    warm.run(script + ['exit', '0'], timeout=120)  # a server is up
    monkeypatch.setenv('OMP_NUM_THREADS', '2')
    ran = warm.run(script + ['imported'], capture_output=True, text=True, timeout=120)
    threads, timeout = min(2, os.cpu_count()), float(os.environ.get('NBTRAINER_DIST_TIMEOUT', 300))
    assert ran.stdout.splitlines()[-3:-1] == ['True', f'{threads} {timeout}']


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
    assert warm.run([path, 'imported'], **given).stdout.splitlines()[-3] == 'True'  # warm
    runs = Path(sys.executable).parent / 'nbtrainer-runs'
    assert type(warm.Popen([runs, '--help'], stdout=subprocess.DEVNULL)) is warm.Popen
    ran, cold = warm.run([runs, '--help'], **given), subprocess.run([runs, '--help'], **given)
    assert (ran.returncode, ran.stdout, ran.stderr) == (
        cold.returncode,
        cold.stdout,
        cold.stderr,
    ) and 'usage' in ran.stdout


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
    monkeypatch.setattr(warm, '_servers', {})  # this test's own server
    codes = []
    thread = threading.Thread(target=lambda: codes.append(warm.run(script + ['exit', '0'], timeout=120).returncode))
    thread.start()
    thread.join()
    (server,) = warm._servers.values()
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
        print(*[server.process.pid for server in warm._servers.values()], flush=True)
        os._exit(0)
    """
    done = subprocess.run([sys.executable, '-c', textwrap.dedent(code)], capture_output=True, text=True, timeout=300)
    server = int(done.stdout.split()[-1])
    gone = lambda: not os.path.exists(f'/proc/{server}') or ') Z ' in Path(f'/proc/{server}/stat').read_text()
    wait_for(gone, 'the warm server to end with its parent', timeout=60)
