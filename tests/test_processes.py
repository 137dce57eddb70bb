"""fork(), Ctrl-C and interpreter exit, each in a child process of its own."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from .children import INTERRUPTIBLE

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

PRELUDE = """
import asyncio, os, sys, threading, time
import numpy as np
from asyncloader import DataLoader

class Data:
    def __init__(self, n): self.n = n
    def __len__(self): return self.n
    def __getitem__(self, i): return i

class AsyncData(Data):
    async def __getitem__(self, i):
        await asyncio.sleep(0)
        return i

class Forever(Data):
    def __getitem__(self, i):
        if i >= 4:
            threading.Event().wait()  # never returns
        return i
"""


WHEN_BLOCKED = """
import signal, traceback

def main_thread_in(name, filename=""):
    frame = sys._current_frames()[threading.main_thread().ident]
    return any(f.name == name and filename in f.filename
               for f in traceback.extract_stack(frame))

def interrupt_when(name, filename=""):
    while not main_thread_in(name, filename):
        time.sleep(0.001)
    global sent
    sent = time.monotonic()
    os.kill(os.getpid(), signal.SIGINT)

def interrupt_when_blocked():
    interrupt_when("get", "_handoff")
"""
"""A child's ``interrupt_when(name, filename)``: run on a thread of its own, it sends SIGINT
to its process once the main thread is inside that function (seen in its stack), so the
signal always lands there; ``interrupt_when_blocked``: inside the loader's wait."""


def _interrupted(script: str) -> subprocess.CompletedProcess[str]:
    """``_run`` of ``script`` in a child that takes SIGINT, with ``WHEN_BLOCKED``'s helpers."""
    return _run(INTERRUPTIBLE + WHEN_BLOCKED + textwrap.dedent(script))


def _run(script: str, timeout: float = 30.0) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-X", "dev", "-c", PRELUDE + textwrap.dedent(script)],
        capture_output=True,
        text=True,
        timeout=timeout,
        cwd=ROOT,
    )


@pytest.mark.parametrize("kind", ["Data", "AsyncData"])
def test_a_forked_child_runs_a_whole_epoch_while_the_parent_goes_on(kind: str) -> None:
    result = _run(
        rf"""
        loader = DataLoader({kind}(100), batch_size=10, num_workers=2, item_concurrency=2)
        it = iter(loader)
        first = next(it)
        import warnings  # CPython >= 3.12 warns at any fork() of a threaded process
        warnings.filterwarnings("ignore", message=r".*use of fork\(\) may lead to deadlocks")
        pid = os.fork()
        if pid == 0:
            got = [b.tolist() for b in loader]
            ok = got == [list(range(i, i + 10)) for i in range(0, 100, 10)]
            os._exit(0 if ok else 3)
        rest = [b.tolist() for b in it]
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0, status
        assert first.tolist() == list(range(10)) and len(rest) == 9
        assert len(list(loader)) == 10
        loader.close()
        print("ok")
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "ok"
    assert "Warning" not in result.stderr, result.stderr


def test_ctrl_c_in_a_blocked_for_raises_promptly_and_the_loader_goes_on() -> None:
    result = _interrupted(
        """
        loader = DataLoader(Forever(8), batch_size=4, num_workers=1)
        it = iter(loader)
        next(it)
        threading.Thread(target=interrupt_when_blocked, daemon=True).start()
        try:
            next(it)
        except KeyboardInterrupt:
            print("interrupted after", time.monotonic() - sent)
        assert next(it, "ended") == "ended"  # the interrupted epoch is over
        loader.dataset.n = 4
        print("next epoch", [b.tolist() for b in loader])
        """
    )
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("interrupted after"), result.stdout
    assert lines[1] == "next epoch [[0, 1, 2, 3]]"
    latency = float(lines[0].split()[-1])
    # Not a speed claim: a generous bound that only a blocked, signal-deaf wait would miss.
    assert latency < 2.0, latency


def test_ctrl_c_while_a_dropped_iterator_waits_for_its_epoch_is_not_lost() -> None:
    # Dropping an iterator mid-epoch cancels its epoch and waits (up to 5 s) for calls still
    # running; that wait runs in __del__, where Python prints and drops any exception:
    # Ctrl-C there was "Exception ignored in: ... __del__" and the program went on.
    result = _interrupted(
        """
        loader = DataLoader(Forever(100), batch_size=4, num_workers=2, item_concurrency=2)
        it = iter(loader)
        next(it)  # items from 4 on never return
        threading.Thread(target=interrupt_when, args=("_cancel",), daemon=True).start()
        try:
            del it
            time.sleep(20)  # Ctrl-C ends a sleep: the interrupt must come as one does
            print("not interrupted", flush=True)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["interrupted"]
    assert "Exception ignored" not in result.stderr, result.stderr


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_saved_after_ctrl_c_resumes_exactly(workers: int) -> None:
    # Saving a checkpoint in `except KeyboardInterrupt` is common: the state is that of the
    # batches received, whatever the interrupted epoch had in work. With num_workers=0 (the
    # batch made inside next()) the interrupted batch counted as received, so the resumed
    # epoch began a batch late, and the interrupted one went on with the batch after it.
    result = _interrupted(
        f"""
        workers = {workers}
        gate = threading.Event()

        class Gated(Data):
            blocked = -1
            def __getitem__(self, i):
                if i == self.blocked:
                    gate.wait()
                return i

        def make():
            return DataLoader(Gated(24), batch_size=4, shuffle=True, num_workers=workers, seed=3)

        full = [b.tolist() for b in make()]
        loader = make()
        loader.dataset.blocked = full[2][1]  # batch 2 waits on it
        it = iter(loader)
        got = [next(it).tolist(), next(it).tolist()]
        # Not any wait of threading.py: Thread.start() waits in one as the thread starts.
        blocked = ("get", "_handoff") if workers else ("__getitem__", "<string>")
        threading.Thread(target=interrupt_when, args=blocked, daemon=True).start()
        try:
            for batch in it:
                got.append(batch.tolist())
        except KeyboardInterrupt:
            print("interrupted after", len(got), flush=True)
        print("then", next(it, "ended"), flush=True)  # Ctrl-C ends the epoch
        state = loader.state_dict()
        gate.set()
        loader.close()
        again = make()
        again.load_state_dict(state)
        rest = [b.tolist() for b in again]
        print("exact", got + rest == full, len(rest), flush=True)
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["interrupted after 2", "then ended", "exact True 4"]


def test_ctrl_c_while_a_stream_blocks_closes_it_once_its_call_returns() -> None:
    # Ctrl-C replaced the busy I/O threads at once, and the stream's close, meant for them,
    # was refused: "RuntimeError: asyncloader-io pool is shut down" on stderr, and the
    # generator's finally never ran.
    result = _interrupted(
        """
        gate, closes = threading.Event(), []

        class Stream:
            def __iter__(self):
                try:
                    for i in range(8):
                        if i == 5:
                            gate.wait()
                        yield i
                finally:
                    closes.append(threading.current_thread().name)

        loader = DataLoader(Stream(), batch_size=4)
        it = iter(loader)
        next(it)
        threading.Thread(target=interrupt_when_blocked, daemon=True).start()
        try:
            next(it)
        except KeyboardInterrupt:
            print("interrupted", flush=True)
        gate.set()
        print("next epoch", [b.tolist() for b in loader], flush=True)
        for _ in range(1000):  # until the first epoch's stream is closed too, or 10 s
            if len(closes) == 2:
                break
            time.sleep(0.01)
        print("closed", len(closes), flush=True)
        loader.close()
        """
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "interrupted",
        "next epoch [[0, 1, 2, 3], [4, 5, 6, 7]]",
        "closed 2",
    ]
    assert result.stderr == ""


def test_ctrl_c_as_the_loaders_thread_starts_is_a_keyboard_interrupt() -> None:
    # SIGINT raised just as the event loop's thread has started (the user's Ctrl-C at the
    # first batch): its loop was closed while it ran, and "RuntimeError: Cannot close a running
    # event loop" took the KeyboardInterrupt's place.
    result = _run(
        INTERRUPTIBLE
        + textwrap.dedent(
            """
        start = threading.Thread.start

        def start_then_interrupt(thread):
            start(thread)
            if thread.name == "asyncloader-loop" and not interrupted:
                signal.raise_signal(signal.SIGINT)

        interrupted = False
        threading.Thread.start = start_then_interrupt
        loader = DataLoader(Data(8), batch_size=4, num_workers=1)
        try:
            next(iter(loader))
        except KeyboardInterrupt:
            interrupted = True
            print("interrupted", flush=True)
        print("next epoch", [b.tolist() for b in loader], flush=True)
        loader.close()
        for _ in range(300):  # until the first loop's thread has ended, or 3 s
            if not [t for t in threading.enumerate() if t.name == "asyncloader-loop"]:
                break
            time.sleep(0.01)
        print("loop threads", [t.name for t in threading.enumerate() if "loop" in t.name])
        """
        )
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == [
        "interrupted",
        "next epoch [[0, 1, 2, 3], [4, 5, 6, 7]]",
        "loop threads []",
    ]
    assert result.stderr == ""


@pytest.mark.parametrize(
    "setup",
    [
        "loader = DataLoader(Data(100), batch_size=4, num_workers=2); it = iter(loader); next(it)",
        "loader = DataLoader(AsyncData(100), batch_size=4, num_workers=2, item_concurrency=4)\n"
        "it = iter(loader); next(it)",
        "loader = DataLoader(Forever(100), batch_size=4, num_workers=2, item_concurrency=2)\n"
        "it = iter(loader); next(it)",
        "async def main():\n"
        "    global it\n"
        "    loader = DataLoader(AsyncData(100), batch_size=4, num_workers=2)\n"
        "    it = aiter(loader); await anext(it)\n"
        "asyncio.run(main())",
    ],
    ids=["sync-workers", "async-dataset", "blocked-forever", "async-for"],
)
def test_exit_with_live_loaders_and_iterators_is_prompt_and_clean(setup: str) -> None:
    result = _run(setup + "\nprint('done')\n")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "done"
    assert "Traceback" not in result.stderr, result.stderr
    assert "was destroyed but it is pending" not in result.stderr, result.stderr


def test_ctrl_c_at_any_line_of_an_epochs_start_leaves_nothing_behind() -> None:
    # KeyboardInterrupt raised at each line, in turn, that `for batch in loader` runs in the
    # loader's code to start an epoch (a trace function raises it there, as Python raises a
    # Ctrl-C at the line it has reached). At 7 of 98 such lines the epoch's coroutines had
    # been made in the caller's thread and never reached the loop: "coroutine 'drive' was
    # never awaited" (about 1 run in 50 of a script interrupted 0-4 ms into its first epoch).
    result = _run(
        """
        import gc, json, warnings
        FILES = tuple(f"asyncloader/{name}.py"
                      for name in ("_loader", "_runtime", "_loop_thread", "_iterators"))
        FILES += ("/weakref.py", "/_weakrefset.py")  # run by uvloop as it builds a loop

        def in_finalizer(frame):  # a Ctrl-C there is raised again later, by design
            while frame is not None:
                if frame.f_code.co_name == "__del__":
                    return True
                frame = frame.f_back
            return False

        outcomes = []
        for target in range(1, 1000):
            loader = DataLoader(Data(8), batch_size=2, num_workers=1)
            seen, where = 0, None

            def local(frame, event, arg):
                global seen, where
                if event == "line" and not in_finalizer(frame):
                    seen += 1
                    if seen == target:
                        where = f"{frame.f_code.co_filename[-20:]}:{frame.f_lineno}"
                        raise KeyboardInterrupt
                return local

            def tracer(frame, event, arg):
                return local if frame.f_code.co_filename.endswith(FILES) else None

            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                sys.settrace(tracer)
                try:
                    first = [b.tolist() for b in loader]
                except KeyboardInterrupt:
                    first = None
                finally:
                    sys.settrace(None)
                second = [b.tolist() for b in loader]
                loader.close()
                gc.collect()
            outcomes.append([where, first is None, second, [str(w.message) for w in caught]])
            if first is not None:
                break
        print(json.dumps(outcomes))
        """,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    outcomes = json.loads(result.stdout.splitlines()[-1])
    assert len(outcomes) > 50  # the lines tried, the last one not interrupted
    assert [interrupted for _, interrupted, _, _ in outcomes] == [True] * (len(outcomes) - 1) + [
        False
    ]
    epoch = [[0, 1], [2, 3], [4, 5], [6, 7]]
    assert [(where, second) for where, _, second, _ in outcomes if second != epoch] == []
    assert [(where, said) for where, _, _, said in outcomes if said] == []
    assert result.stderr == ""
