"""Run the notebooks as nbdev-test does, N at a time, each in a fresh process forked from one that imported torch and
nbdev once.

    python tools/test_notebooks.py [-j N] NOTEBOOK...

Each notebook needs a process of its own: notebooks re-run the cells that attach methods to shared classes
(Learner.fit_async, ...), and a worker pool would carry one notebook's definitions into the next. A new interpreter per
notebook paid torch's and nbdev's imports each time (about 2 s of CPU, most of a small notebook's run); a fork pays
them once. Nothing of nbtrainer is imported before the fork, so each notebook imports what it imports, as in a fresh
interpreter. Prints `ok   NB (S s)`, or `FAIL NB (S s)` and the notebook's output, as each ends; exits 1 if any failed.
"""

import argparse, os, sys, tempfile, time, traceback


def run(path, log):
    "In the forked child: test one notebook with nbdev's test_nb and the project's nbdev settings; its output to `log`."
    from nbdev.config import get_config
    from nbdev.test import test_nb

    fd = os.open(log, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    os.dup2(fd, 1)
    os.dup2(fd, 2)
    config = get_config()
    flags = config.tst_flags.split() if isinstance(config.tst_flags, str) else list(config.tst_flags or ())
    os.chdir(config.nbs_path)
    ok, _ = test_nb(os.path.abspath(path), skip_flags=flags, force_flags=[], basepath=config.config_path,
                    cell_timeout=config.cell_timeout or None)  # fmt: skip
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0 if ok else 1)


def shown(path):
    "The path as the command line gave it when it is in the project (`nbs/...`), else whole."
    inside = path.startswith(os.getcwd() + os.sep)
    return os.path.relpath(path) if inside else path


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument('-j', '--jobs', type=int, default=os.cpu_count() or 2)
    parser.add_argument('notebooks', nargs='+')
    args = parser.parse_args()
    notebooks = [os.path.abspath(nb) for nb in args.notebooks]  # before any chdir
    import torch, nbdev.test  # noqa: F401 - imported once, before the forks

    logs, running, failed = tempfile.mkdtemp(prefix='notebooks-'), {}, []
    pending = list(reversed(notebooks))
    while pending or running:
        while pending and len(running) < args.jobs:
            path = pending.pop()
            log = os.path.join(logs, os.path.relpath(path).replace(os.sep, '_') + '.log')
            pid = os.fork()
            if pid == 0:
                try:
                    run(path, log)
                except BaseException:
                    traceback.print_exc()  # an error before test_nb returned: into the log (stderr is the log by now)
                finally:
                    os._exit(2)
            running[pid] = (path, log, time.monotonic())
        pid, status = os.wait()
        path, log, start = running.pop(pid)
        seconds, name = round(time.monotonic() - start), shown(path)
        if os.waitstatus_to_exitcode(status) == 0:
            print(f'ok   {name} ({seconds} s)', flush=True)
        else:
            failed.append(name)
            print(f'FAIL {name} ({seconds} s)', flush=True)
            with open(log, errors='replace') as f:
                print(f.read(), flush=True)
    for name in failed:
        print(f'failed: {name} (run: nbdev-test {name})')
    sys.exit(1 if failed else 0)


if __name__ == '__main__':
    main()
