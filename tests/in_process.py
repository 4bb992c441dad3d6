"""A binary's real main(argv) run in the test process, on the real files: what it prints,
logs and returns, as `python -m toolkit.bin.NAME` gives them, without the ~2 s of imports
of a fresh interpreter. For tests of what a binary does, not of the process itself
(signals, environment, stdin, an uncaught crash's exit status): those start a real one."""
import contextlib
import io
import logging
import os
import subprocess
import sys


def run_main(main, argv) -> subprocess.CompletedProcess:
    """`main(argv)` with stdout and stderr captured, its logging included: the root logger
    starts as in a fresh interpreter (no handler, level WARNING), so setup_logging and
    logging.basicConfig bind their console handler to the captured stderr, and pytest's
    handlers and level are put back afterwards. The exit status is what the interpreter
    makes of main's return value or of SystemExit (argparse's errors): None 0, a message 1."""
    argv = [str(a) for a in argv]
    # What a process of its own would have kept to itself: environment, working directory
    # and torch's thread count (backends set one thread) are put back too.
    environ, cwd = dict(os.environ), os.getcwd()
    torch = sys.modules.get("torch")
    threads = torch.get_num_threads() if torch is not None else None
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    for handler in handlers:
        root.removeHandler(handler)
    root.setLevel(logging.WARNING)
    out, err = io.StringIO(), io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                rc = main(argv)
            except SystemExit as exit:
                rc = exit.code
    finally:
        os.environ.clear()
        os.environ.update(environ)
        os.chdir(cwd)
        if threads is not None:
            torch.set_num_threads(threads)
        for handler in list(root.handlers):
            root.removeHandler(handler)
            handler.close()                # the binary's own (a log file it opened)
        for handler in handlers:
            root.addHandler(handler)
        root.setLevel(level)
    if rc is None:
        rc = 0
    elif not isinstance(rc, int):
        err.write(f"{rc}\n")
        rc = 1
    return subprocess.CompletedProcess(["main", *argv], rc, out.getvalue(), err.getvalue())
