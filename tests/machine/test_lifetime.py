"""`exit_rank`: a rank ends with its main's code and skips the interpreter's teardown."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _run(body: str) -> subprocess.CompletedProcess:
    script = textwrap.dedent("""
        import atexit, threading, time
        from machine.lifetime import exit_rank
        atexit.register(lambda: print("teardown ran", flush=True))
        threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # a thread still inside a call
    """) + textwrap.dedent(body)
    return subprocess.run([sys.executable, "-c", script], cwd=ROOT, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("code", [0, 3])
def test_the_process_exits_with_mains_code_and_no_teardown(code):
    done = _run(f"""
        def main():
            print("results written", flush=True)
            return {code}
        exit_rank(main)
    """)
    assert done.returncode == code
    assert done.stdout == "results written\n"  # the atexit hook never ran


def test_an_exception_prints_its_traceback_and_exits_1():
    done = _run("""
        def main():
            raise RuntimeError("rank 1 could not read blocks.0.weight")
        exit_rank(main)
    """)
    assert done.returncode == 1
    assert "RuntimeError: rank 1 could not read blocks.0.weight" in done.stderr
    assert "teardown ran" not in done.stdout


def test_a_usage_error_keeps_its_exit_code():
    done = _run("""
        import argparse
        def main():
            argparse.ArgumentParser(prog="worker").parse_args(["--bogus"])
            return 0
        exit_rank(main)
    """)
    assert done.returncode == 2 and "unrecognized arguments: --bogus" in done.stderr


def test_wait_polling_returns_the_code_or_times_out_naming_the_process():
    from machine.lifetime import wait_polling

    answers = iter([None, None, -9])
    assert wait_polling(lambda: next(answers), None, "rank 1", 0.001) == -9
    with pytest.raises(subprocess.TimeoutExpired, match="rank 1"):
        wait_polling(lambda: None, 0.05, "rank 1", 0.01)
