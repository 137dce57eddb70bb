"""What torch users' code does to an iterator: two threads pulling from it, fork() with it
alive, exceptions that keep it in a reference cycle, ``timeout`` on the default settings.
What could hang runs in a child process with a hard time-out."""

from __future__ import annotations

import asyncio
import json
import logging
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from asyncloader import DataLoader

from .children import run_script as run_child
from .datasets import AsyncData, SyncData

ROOT = Path(__file__).parent.parent


@pytest.mark.parametrize(("num_workers", "batches"), [(2, 50), (0, 50)])
def test_two_threads_pulling_from_one_iterator_both_return(num_workers: int, batches: int) -> None:
    loader = DataLoader(list(range(100)), batch_size=2, num_workers=num_workers)
    iterator = iter(loader)
    got: list[Any] = []
    lock = threading.Lock()

    def pull() -> None:
        for batch in iterator:
            with lock:
                got.append(batch.tolist())

    threads = [threading.Thread(target=pull, daemon=True) for _ in range(2)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=20)
    assert [thread.is_alive() for thread in threads] == [False, False]
    assert sorted(got) == [[i, i + 1] for i in range(0, 100, 2)]
    assert len(got) == batches
    loader.close()


@pytest.mark.parametrize("ending", ["end", "aclose"])
async def test_two_tasks_pulling_from_one_async_iterator_both_return(ending: str) -> None:
    # The task that took the epoch's end left the other waiting on the hand-off for ever
    # (all 10 batches delivered, then a hang), where two threads on one iterator both return.
    loader = DataLoader(AsyncData(40), batch_size=4, num_workers=2)
    iterator = aiter(loader)
    got: list[Any] = []

    async def pull() -> None:
        async for batch in iterator:
            got.append(batch.tolist())
            if ending == "aclose" and len(got) == 3:
                await iterator.aclose()  # type: ignore[attr-defined]

    await asyncio.wait_for(asyncio.gather(pull(), pull()), 20)
    if ending == "end":
        assert sorted(got) == [[i, i + 1, i + 2, i + 3] for i in range(0, 40, 4)]
    else:
        assert len(got) in (3, 4)  # the other task may have taken one as the first closed
    await loader.aclose()


def test_an_async_epoch_awaited_from_another_event_loop_says_where_it_runs() -> None:
    # `asyncio.run(anext(iterator))` once per step: the epoch's driver is a task of the
    # first loop, and the second said only "<asyncio.locks.Event ...> is bound to a
    # different event loop".
    loader = DataLoader(AsyncData(40), batch_size=4, num_workers=1)
    iterator = aiter(loader)

    async def step() -> Any:
        return await anext(iterator)

    assert asyncio.run(step()).tolist() == [0, 1, 2, 3]
    with pytest.raises(RuntimeError, match="started on another event loop") as refused:
        asyncio.run(step())
    assert "async for" in str(refused.value)
    assert loader.state_dict()["batches_received"] == 1
    assert [batch.tolist() for batch in loader][:1] == [[0, 1, 2, 3]]  # the next epoch
    loader.close()


def test_closing_an_iterator_wakes_a_thread_blocked_in_next() -> None:
    release = threading.Event()

    class Blocking:
        def __len__(self) -> int:
            return 4

        def __getitem__(self, index: int) -> int:
            release.wait(20)
            return index

    loader = DataLoader(Blocking(), num_workers=1)
    iterator: Any = iter(loader)
    outcome: list[Any] = []
    waiter = threading.Thread(target=lambda: outcome.append(next(iterator, "ended")))
    waiter.start()
    time.sleep(0.2)  # let it block in next(): there is nothing to wait on from here
    threading.Thread(target=iterator.close).start()
    waiter.join(timeout=3)
    assert not waiter.is_alive()
    assert outcome == ["ended"]
    release.set()
    loader.close()


def test_timeout_holds_on_the_direct_path() -> None:
    release = threading.Event()

    class Slow:
        def __len__(self) -> int:
            return 2

        def __getitem__(self, index: int) -> int:
            release.wait(20)
            return index

    loader = DataLoader(Slow(), timeout=0.2)  # num_workers=0, item_concurrency=1
    iterator = iter(loader)
    with pytest.raises(TimeoutError, match=r"timeout=0\.2"):
        next(iterator)
    release.set()
    assert next(iterator).tolist() == [0]  # the batch that timed out is not lost
    loader.close()


def test_timeout_zero_is_torchs_no_timeout() -> None:
    loader = DataLoader(list(range(4)), batch_size=2, timeout=0)
    assert [batch.tolist() for batch in loader] == [[0, 1], [2, 3]]


def test_an_iterator_inherited_through_fork_raises_at_once() -> None:
    result = run_child(
        """
        import os, time
        from asyncloader import DataLoader
        loader = DataLoader(list(range(64)), batch_size=2, num_workers=2)
        it = iter(loader)
        next(it)
        pid = os.fork()
        if pid == 0:
            code = 3
            try:
                next(it)
            except RuntimeError as error:
                code = 0 if "before fork()" in str(error) else 4
            started = time.monotonic()
            del it
            code = code or (5 if time.monotonic() - started > 1.0 else 0)
            os._exit(code)
        _, status = os.waitpid(pid, 0)
        print("child", os.waitstatus_to_exitcode(status))
        assert len(list(it)) == 31  # the parent's epoch goes on
        loader.close()
        """
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.split() == ["child", "0"]


CYCLE = """
import asyncio, gc, sys, time
from asyncloader import DataLoader

class Boom:
    def __len__(self):
        return 64

    {define} __getitem__(self, index):
        if index == 0:
            raise ValueError("bad item")
        return index

loader = DataLoader(Boom(), batch_size=4, num_workers=4)

{define} consume():
    it = {start}
    try:
        {next}
    except ValueError as error:
        kept = error  # the frame holds its own traceback: the iterator is in a cycle

async def main():
    gc.disable()
    {call}
    await asyncio.sleep(0.3)  # the driver fills its window and waits for a permit
    started = time.monotonic()
    gc.collect()
    print(f"{{time.monotonic() - started:.2f}}")
    await asyncio.sleep(0.1)
    {close}

asyncio.run(main())
"""


@pytest.mark.parametrize("kind", ["sync", "async"])
def test_an_iterator_in_a_reference_cycle_is_collected_quickly_and_quietly(kind: str) -> None:
    if kind == "async":
        script = CYCLE.format(
            define="async def",
            start="aiter(loader)",
            next="await anext(it)",
            call="await consume()",
            close="await loader.aclose()",
        )
    else:
        script = CYCLE.format(
            define="def",
            start="iter(loader)",
            next="next(it)",
            call="await asyncio.to_thread(consume)",
            close="loader.close()",
        )
    result = run_child(script)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "Task was destroyed" not in result.stderr
    assert "GeneratorExit" not in result.stderr
    assert result.stderr == ""
    assert float(result.stdout.strip()) < 2.5  # not the 5 s bounded wait


def test_closing_during_a_long_skip_ahead_of_an_async_stream_stops_it() -> None:
    # A resumed stream without a state of its own reads its first batches again. An async
    # generator that never waits kept the loop thread in that loop: close() waited 8 s for
    # it, then left it spinning a core.
    child = run_child(
        """
        import threading, time, warnings
        from asyncloader import DataLoader

        class Endless:
            async def __aiter__(self):
                n = 0
                while True:
                    yield n
                    n += 1

        with DataLoader(Endless(), batch_size=4) as first:
            iterator = iter(first)
            next(iterator)
            state = first.state_dict()
            iterator.close()
        state["batches_received"] = 10**12
        loader = DataLoader(Endless(), batch_size=4, timeout=1)
        with warnings.catch_warnings(record=True):
            loader.load_state_dict(state)
        iterator = iter(loader)
        try:
            next(iterator)
        except TimeoutError:
            print("timed out")
        started = time.perf_counter()
        loader.close()
        print("closed in", round(time.perf_counter() - started, 1))
        print("loop threads", [t.name for t in threading.enumerate() if "loop" in t.name])
        """
    )
    assert child.returncode == 0, child.stderr
    assert "timed out" in child.stdout
    assert "closed in 0.0" in child.stdout or "closed in 0.1" in child.stdout, child.stdout
    assert "loop threads []" in child.stdout


STOPPING = """
import json
import sys
from asyncloader import DataLoader

where, mode = sys.argv[1], sys.argv[2]


class Data:
    def __len__(self):
        return 6

    def __getitem__(self, index):
        if where == "getitem" and index == 2:
            raise StopIteration  # a next() on an exhausted iterator, say
        return index


class AsyncData(Data):
    async def __getitem__(self, index):
        return Data.__getitem__(self, index)


def transform(index, item):
    if where == "transform" and index == 2:
        raise StopIteration
    return item


def collate(items):
    if where == "collate" and 2 in items:
        raise StopIteration
    return list(items)


if __name__ == "__main__":
    settings = {
        "inline": {"num_workers": 0},
        "lanes": {"num_workers": 2},
        "threads": {"num_workers": 2, "cpu_threads": 2},
        "processes": {"cpu_processes": 2},
        "async": {"num_workers": 2},
    }[mode]
    steps = {"transform": transform} if where == "transform" else {}
    loader = DataLoader(
        AsyncData() if mode == "async" else Data(),
        batch_size=2,
        collate_fn=collate if where == "collate" else None,
        timeout=30,
        **steps,
        **settings,
    )
    out = []
    iterator = iter(loader)
    while True:
        try:
            batch = next(iterator)
        except StopIteration:
            break
        except Exception as error:
            out.append(type(error).__name__ + ": " + str(error)[:40])
        else:
            out.append([int(item) for item in batch])
    print(json.dumps(out))
    loader.close()
"""


@pytest.mark.parametrize("mode", ["inline", "lanes", "threads", "processes", "async"])
@pytest.mark.parametrize("where", ["getitem", "transform", "collate"])
def test_a_stop_iteration_from_the_users_code_fails_its_batch(
    tmp_path: Path, where: str, mode: str
) -> None:
    # A StopIteration escaping a dataset, a transform or a collate_fn ended the epoch there
    # silently when run inline (torch's loader does the same); on a CPU thread or in a worker
    # process, where it was set on an asyncio future (which refuses it), its batch waited
    # forever. 8 of these 15 cases failed so (the coroutines' own PEP 479 saved the rest).
    script = tmp_path / "stopping.py"
    script.write_text(STOPPING)
    child = subprocess.run(
        [sys.executable, str(script), where, mode],
        capture_output=True,
        text=True,
        timeout=60,
        cwd=ROOT,
    )
    assert child.returncode == 0, child.stderr[-2000:]
    batches = json.loads(child.stdout)
    assert batches[0] == [0, 1]
    assert batches[1].startswith("RuntimeError: ")
    assert "StopIteration" in batches[1] or "the dataset, transform or collat" in batches[1]
    assert batches[2:] == [[4, 5]]


def test_a_sampler_that_an_earlier_epoch_used_up_is_said_to_be(
    caplog: pytest.LogCaptureFixture,
) -> None:
    # A one-shot iterator as the sampler (or batch sampler): every epoch after the first
    # passed with no batch and no word, as torch's do.
    caplog.set_level(logging.WARNING, logger="asyncloader")
    for name, settings in (
        ("sampler", {"sampler": iter(range(10)), "batch_size": 4}),
        ("batch_sampler", {"batch_sampler": iter([[0, 1], [2]])}),
    ):
        with DataLoader(SyncData(10), **settings) as loader:
            assert len([batch for batch in loader]) > 0
            caplog.clear()
            assert [batch for batch in loader] == []
        messages = [r.getMessage() for r in caplog.records if r.name == "asyncloader"]
        assert len(messages) == 1
        assert messages[0].startswith(f"{name} is an iterator")
        assert "epoch 1 has no batch" in messages[0]
    caplog.clear()
    with DataLoader(SyncData(10), batch_size=4, sampler=[]) as loader:  # empty, not used up
        assert [batch for batch in loader] == [] == [batch for batch in loader]
    assert not [r for r in caplog.records if r.name == "asyncloader"]
