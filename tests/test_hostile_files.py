"""FileDataset against a hostile writer inside ``root``: symlink swaps, FIFOs, devices, loops.

The races run for real: a thread swaps a file for a symbolic link to a file outside ``root``
while the dataset reads it. What could block forever runs in a subprocess with a hard time-out.
"""

from __future__ import annotations

import asyncio
import os
import socket
import subprocess
import sys
import textwrap
import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from asyncloader import FileDataset

ROOT = Path(__file__).parent.parent
SECRET = b"SECRET, outside root"


@pytest.fixture
def swapped(tmp_path: Path) -> Iterator[Path]:
    """``root/item`` flips between a regular file and a link to a file outside ``root``."""
    root = tmp_path / "root"
    root.mkdir()
    secret = tmp_path / "secret"
    secret.write_bytes(SECRET)
    stop = threading.Event()

    def swap() -> None:
        link, plain, item = root / ".link", root / ".plain", root / "item"
        while not stop.is_set():
            link.unlink(missing_ok=True)
            link.symlink_to(secret)
            os.replace(link, item)
            plain.write_bytes(b"inside")
            os.replace(plain, item)

    (root / "item").write_bytes(b"inside")
    writer = threading.Thread(target=swap, name="swapper", daemon=True)
    writer.start()
    try:
        yield root
    finally:
        stop.set()
        writer.join(timeout=10)


@pytest.mark.parametrize("mmap", [False, True])
def test_a_symlink_swapped_in_during_the_read_never_delivers_a_file_outside_root(
    swapped: Path, mmap: bool
) -> None:
    dataset = FileDataset(["item"], root=swapped, mmap=mmap)
    outcomes: dict[str, int] = {"inside": 0, "refused": 0, "missing": 0}
    reasons = set()
    # At least 10,000 reads, and on until the swapper has been seen at work: on a loaded host
    # its thread may not run at all during the first 10,000.
    for reads in range(400_000):
        if reads >= 10_000 and outcomes["inside"] and outcomes["refused"]:
            break
        try:
            data = bytes(dataset[0])
        except PermissionError as error:
            reasons.add(error.strerror)
            outcomes["refused"] += 1
            continue
        except FileNotFoundError:  # between the two renames nothing is there
            outcomes["missing"] += 1
            continue
        assert data != SECRET, "read a file outside root"
        assert data == b"inside"
        outcomes["inside"] += 1
    assert outcomes["inside"] > 0, outcomes
    assert outcomes["refused"] > 0, outcomes
    assert reasons == {"a symbolic link on its way leaves root (after 1 attempt)"}


def test_links_that_stay_beneath_root_are_followed(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "a.bin").write_bytes(b"a")
    (tmp_path / "rel").symlink_to("data/a.bin")
    (tmp_path / "abs").symlink_to(tmp_path / "data" / "a.bin")
    (tmp_path / "dir").symlink_to("data")
    (tmp_path / "chain").symlink_to("rel")
    (tmp_path / "data" / "up").symlink_to("../data/a.bin")
    locations = ["rel", "abs", "dir/a.bin", "chain", "data/up", "data/../data/a.bin"]
    dataset = FileDataset(locations, root=tmp_path)
    assert [dataset[i] for i in range(len(locations))] == [b"a"] * len(locations)


def test_links_that_leave_root_on_the_way_are_refused(tmp_path: Path) -> None:
    root = tmp_path / "root"
    (root / "sub").mkdir(parents=True)
    (tmp_path / "outside").mkdir()
    (tmp_path / "outside" / "x").write_bytes(SECRET)
    (root / "out_dir").symlink_to(tmp_path / "outside")
    (root / "sub" / "up").symlink_to("../../outside/x")
    (root / "etc").symlink_to("/etc")
    dataset = FileDataset(["out_dir/x", "sub/up", "etc/hostname", "sub/../../outside/x"], root=root)
    for index in range(4):
        with pytest.raises(PermissionError, match="leaves root"):
            dataset[index]


def test_a_link_loop_fails_its_item(tmp_path: Path) -> None:
    (tmp_path / "a").symlink_to("b")
    (tmp_path / "b").symlink_to("a")
    with pytest.raises(OSError, match="too many symbolic links"):
        FileDataset(["a"], root=tmp_path)[0]


def test_devices_are_refused_and_kernel_files_are_read_not_mapped_empty() -> None:
    for mmap in (False, True):
        with pytest.raises(OSError, match="character device, not a regular file"):
            FileDataset(["/dev/zero"], mmap=mmap)[0]
        status = bytes(FileDataset(["/proc/self/status"], mmap=mmap)[0])
        assert status.startswith(b"Name:"), status[:40]


def printed_by(script: str) -> list[str]:
    """The lines ``script`` prints, run in a child with a hard time-out (what it reads could
    block for ever); it must exit cleanly."""
    result = subprocess.run(
        [sys.executable, "-c", script], capture_output=True, text=True, timeout=60, cwd=ROOT
    )
    assert result.returncode == 0, result.stderr[-2000:]
    return result.stdout.splitlines()


def test_a_fifo_under_root_fails_its_item_instead_of_blocking(tmp_path: Path) -> None:
    """No writer ever opens the FIFO: a plain open() blocks forever, so this runs in a child."""
    os.mkfifo(tmp_path / "pipe")
    (tmp_path / "ok").write_bytes(b"ok")
    script = textwrap.dedent(
        f"""
        from asyncloader import DataLoader, FileDataset
        for mmap, workers in ((False, 0), (True, 0), (False, 2)):
            data = FileDataset(["pipe", "ok"], root={str(tmp_path)!r}, mmap=mmap)
            loader = DataLoader(data, collate_fn=list, num_workers=workers, timeout=20)
            it = iter(loader)
            try:
                next(it)
            except OSError as error:
                print("refused:", error)
            print("next:", bytes(next(it)[0]))
        """
    )
    lines = printed_by(script)
    assert len(lines) == 6, lines
    assert all("a FIFO, not a regular file" in line for line in lines[::2]), lines
    assert lines[1::2] == ["next: b'ok'"] * 3


def test_a_file_on_the_way_is_not_a_directory(tmp_path: Path) -> None:
    (tmp_path / "file").write_bytes(b"f")
    with pytest.raises(NotADirectoryError):
        FileDataset(["file/x"], root=tmp_path)[0]


@pytest.mark.parametrize("root", [True, False])
def test_a_file_named_as_a_directory_is_not_read_as_one(tmp_path: Path, root: bool) -> None:
    # Beneath root, "file/" (and a link to "file/") read the file, which open() refuses.
    (tmp_path / "file").write_bytes(b"f")
    (tmp_path / "slash").symlink_to("file/")
    names = ["file/", "file/.", "slash", "slash/"]
    if root:
        dataset = FileDataset(names, root=tmp_path)
    else:
        dataset = FileDataset([f"{tmp_path}/{name}" for name in names])
    for index in range(len(names)):
        with pytest.raises(NotADirectoryError):
            dataset[index]
    (tmp_path / "folder").mkdir()
    with pytest.raises(IsADirectoryError):
        FileDataset(["folder/"], root=tmp_path)[0]


@pytest.mark.parametrize("root", [True, False])
def test_a_socket_fails_its_item_saying_so(tmp_path: Path, root: bool) -> None:
    # open() of a socket says ENXIO, "No such device or address", naming nothing.
    with socket.socket(socket.AF_UNIX) as listening:
        listening.bind(str(tmp_path / "sock"))
        name = "sock" if root else str(tmp_path / "sock")
        with pytest.raises(OSError, match="it is a socket, not a regular file"):
            FileDataset([name], root=tmp_path if root else None)[0]


@pytest.mark.parametrize("root", [True, False])
def test_a_location_with_a_nul_byte_fails_naming_it(tmp_path: Path, root: bool) -> None:
    with pytest.raises(ValueError, match=r"location 'a\\x00b' has a NUL byte"):
        FileDataset(["a\0b"], root=tmp_path if root else None)[0]


def test_a_file_that_grows_while_it_is_streamed_stops_at_max_bytes(tmp_path: Path) -> None:
    # Checked by its size when opened, then read to its end: a writer that keeps appending
    # (a log, a shard being written) was streamed past max_bytes, without end.
    (tmp_path / "grows").write_bytes(b"x" * 1000)
    dataset = FileDataset(["grows"], root=tmp_path, max_bytes=5000)
    got: list[int] = []

    def grow() -> None:
        with open(tmp_path / "grows", "ab") as file:
            file.write(b"y" * 3000)

    async def sink(chunk: bytes) -> None:
        got.append(len(chunk))
        grow()  # between two reads: the next one sees it

    async def blocking(call: Any, *args: Any) -> Any:
        return call(*args)

    with pytest.raises(ValueError, match="'grows' is over max_bytes=5000"):
        asyncio.run(dataset.stream(0, sink, blocking))
    assert sum(got) <= 5000


@pytest.fixture
def stopped() -> Iterator[int]:
    """The pid of a Python process stopped after importing NumPy: its ``/proc`` files are
    several pages long, which the kernel gives a page a read, and do not change."""
    child = subprocess.Popen(
        [sys.executable, "-c", "import os, signal, numpy; os.kill(os.getpid(), signal.SIGSTOP)"]
    )
    try:
        os.waitpid(child.pid, os.WUNTRACED)
        yield child.pid
    finally:
        child.kill()
        child.wait(timeout=30)


def test_a_read_that_gives_less_than_asked_is_not_the_end(stopped: int) -> None:
    # With max_bytes, a file was read in one read, and what it gave was the item: a page of a
    # kernel file (the rest dropped, and a file over max_bytes passed), at most 2 GiB less
    # 4 KiB of a larger file, whatever a FUSE file system had at hand.
    whole = Path(f"/proc/{stopped}/maps").read_bytes()
    assert len(whole) > 3 * 4096
    assert FileDataset([f"/proc/{stopped}/maps"], max_bytes=1 << 20)[0] == whole
    assert FileDataset(["maps"], root=f"/proc/{stopped}", max_bytes=1 << 20)[0] == whole
    with pytest.raises(ValueError, match="'maps' is over max_bytes"):
        FileDataset(["maps"], root=f"/proc/{stopped}", max_bytes=len(whole) - 1)[0]


def test_a_range_of_a_local_store_is_read_whole(stopped: int) -> None:
    # The same for a byte range of a local object store's file, read in one read.
    from obstore.store import LocalStore

    from asyncloader import ObjectStoreDataset

    whole = Path(f"/proc/{stopped}/maps").read_bytes()
    dataset = ObjectStoreDataset(LocalStore(f"/proc/{stopped}"), [("maps", 100, 3 * 4096)])
    assert asyncio.run(dataset[0]) == whole[100 : 100 + 3 * 4096]
