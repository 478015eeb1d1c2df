"""Issue 20: sessions of one context driven from several Python threads at once (generate in
one, append/fork/close in others, the context closed while a generation runs) give typed
errors or correct results, never a crash or a deadlock.

The stress runs in a child process so that a crash fails this test (with the child's output)
instead of killing the suite, and a deadlock is a timeout instead of a hung run."""
from __future__ import annotations

import subprocess
import sys
import textwrap


STRESS = textwrap.dedent('''
    import random, sys, threading, time
    import pyllamaopt
    from pyllamaopt import PyllamaoptError

    model = pyllamaopt.Model(sys.argv[1])
    PROMPT = "the quick brown fox jumps over the lazy dog " * 3
    untyped = []
    typed = {}
    lock = threading.Lock()

    def guard(fn):
        def run(*args):
            try:
                fn(*args)
            except PyllamaoptError as e:
                with lock:  # typed: closed session or context, overflow, evicted, ...
                    typed[type(e).__name__] = typed.get(type(e).__name__, 0) + 1
            except BaseException as e:  # anything else is a bug
                with lock:
                    untyped.append(f"{fn.__name__}: {type(e).__name__}: {e}")
        return run

    def reference_text():
        with pyllamaopt.Context(model, n_ctx=1024, n_batch=64, n_seq_max=4, n_threads=1) as ctx:
            s = ctx.session()
            s.append_text(PROMPT)
            return s.generate_text(8)

    expected = reference_text()

    def one_round(seed):
        rng = random.Random(seed)
        ctx = pyllamaopt.Context(model, n_ctx=1024, n_batch=64, n_seq_max=4, n_threads=1)
        base = ctx.session()
        base.append_text(PROMPT)
        texts = []

        @guard
        def generator():
            for _ in range(3):
                s = base.fork()
                texts.append(s.generate_text(8))  # greedy: must equal the reference
                s.close()

        @guard
        def appender():
            for _ in range(10):
                s = ctx.session()
                s.append_text("hello world " * rng.randint(1, 4))
                list(s.generate(2))
                s.close()

        @guard
        def forker():
            for _ in range(10):
                f = base.fork()
                f.append_text(" and more")
                f.close()

        @guard
        def closer():
            time.sleep(rng.random() * 0.05)
            if rng.random() < 0.5:
                base.close()
            time.sleep(rng.random() * 0.05)
            ctx.close()  # while the others run

        threads = [threading.Thread(target=t, daemon=True) for t in (generator, appender, forker, closer)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(20)
            if t.is_alive():
                print("DEADLOCK in round", seed, flush=True)
                sys.stdout.flush()
                import os; os._exit(3)
        ctx.close()  # idempotent
        return texts

    deadline = time.monotonic() + 8
    rounds = n_texts = 0
    while time.monotonic() < deadline or rounds < 3:
        for text in one_round(rounds):
            n_texts += 1
            if text != expected:
                untyped.append(f"round {rounds}: generated {text!r}, expected {expected!r}")
        rounds += 1
    print("rounds", rounds, "typed errors", typed, "generations", n_texts)
    for u in untyped:
        print("UNTYPED", u)
    sys.exit(1 if untyped else 0)
''')


def test_sessions_driven_from_threads_give_typed_errors_or_correct_results(tiny_model_path, tmp_path):
    try:  # outside the checkout: its pyllamaopt/ (without the built extension) must not shadow the installed one
        r = subprocess.run([sys.executable, "-c", STRESS, str(tiny_model_path)], capture_output=True, text=True,
                           timeout=60, cwd=tmp_path)
    except subprocess.TimeoutExpired as e:
        raise AssertionError(f"deadlock: the stress did not end in 60 s\n{e.stdout}\n{e.stderr}") from None
    assert r.returncode == 0, f"exit {r.returncode} (negative: killed by that signal)\n{r.stdout}\n{r.stderr[-3000:]}"
    assert "rounds" in r.stdout
    assert "Closed" in r.stdout, f"the stress never hit a closed session or context: {r.stdout}"
