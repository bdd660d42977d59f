"""evalkit's command line: how it ends when Ctrl-C reaches its whole process group."""


def test_an_engine_dying_of_the_groups_ctrl_c_counts_as_the_interruption():
    """Ctrl-C reaches the whole process group: when generation fails because vLLM's engine died of it
    first, evalkit waits for its own SIGINT and reports an interruption, not a crash."""
    import subprocess
    import sys

    code = (
        "import os, signal, threading, time\n"
        "from rlhf_ext.evalkit.interrupt import sigint_follows as _sigint_follows\n"
        "threading.Timer(0.2, lambda: os.kill(os.getpid(), signal.SIGINT)).start()\n"
        "t = time.monotonic(); hit = _sigint_follows(wait=10.0)\n"
        "print(hit, time.monotonic() - t < 5, _sigint_follows(wait=0.2))\n"
    )
    import signal

    # SIGINT as a terminal leaves it (a test run started in the background inherits it ignored)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60,
                         preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["True", "True", "False"]
