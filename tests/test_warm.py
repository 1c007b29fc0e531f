"""tests/warm.py, the warm start of worker scripts, against what `subprocess` gives for the same script started cold."""

import os, signal, subprocess, sys

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
