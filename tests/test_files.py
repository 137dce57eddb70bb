"""FileDataset on real files: contents, missing, unreadable, directories, symlinks, limits."""

from __future__ import annotations

import mmap
import os
import resource
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from asyncloader import DataLoader, FileDataset, Retry, Template

ROOT = Path(__file__).parent.parent


def read_all(dataset: FileDataset, **settings: Any) -> list[Any]:
    """Every item, or the exception raised for it (one item per batch)."""
    out: list[Any] = []
    with DataLoader(dataset, collate_fn=list, **settings) as loader:
        iterator = iter(loader)
        while True:
            try:
                out.append(next(iterator)[0])
            except StopIteration:
                return out
            except Exception as error:
                out.append(error)


@pytest.fixture
def folder(tmp_path: Path) -> Path:
    for i in range(6):
        (tmp_path / f"{i:03d}.bin").write_bytes(bytes([i]) * (i * 1000))
    (tmp_path / "sub").mkdir()
    return tmp_path


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 3)])
def test_files_are_read_whole_and_in_order(
    folder: Path, num_workers: int, item_concurrency: int
) -> None:
    data = FileDataset(Template("{index:03d}.bin"), root=folder, length=6)
    items = read_all(data, num_workers=num_workers, item_concurrency=item_concurrency)
    assert items == [bytes([i]) * (i * 1000) for i in range(6)]


def test_a_root_that_is_not_a_folder_fails_at_construction(folder: Path) -> None:
    # Accepted, then every item of every epoch failed, each saying only that it was missing.
    for root in (folder / "missing", folder / "001.bin"):
        with pytest.raises(ValueError, match=f"root {str(root)!r} is not a folder"):
            FileDataset(["001.bin"], root=root)


def test_paths_given_as_path_objects_are_read(folder: Path) -> None:
    # sorted(folder.glob(...)) gave Path objects, and every item failed ("location of item 0
    # is a PosixPath, not a str").
    paths = sorted(folder.glob("00[12].bin"))
    assert read_all(FileDataset(paths)) == [b"\x01" * 1000, b"\x02" * 2000]
    relative = [path.relative_to(folder) for path in paths]
    assert read_all(FileDataset(relative, root=folder)) == [b"\x01" * 1000, b"\x02" * 2000]
    outside = read_all(FileDataset([Path("..") / folder.name / "001.bin"], root=folder))
    assert isinstance(outside[0], PermissionError)  # checked as a str path is


def test_absolute_paths_without_root(folder: Path) -> None:
    assert read_all(FileDataset([str(folder / "002.bin")])) == [b"\x02" * 2000]


def test_missing_files_and_directories_fail_their_item_at_once(folder: Path) -> None:
    out = read_all(FileDataset(["001.bin", "nope.bin", "sub"], root=folder, retry=Retry(3, 0.5, 1)))
    assert out[0] == b"\x01" * 1000
    assert type(out[1]) is FileNotFoundError
    assert "after 1 attempt" in str(out[1])
    assert out[1].errno == 2
    assert isinstance(out[2], IsADirectoryError)


def test_paths_that_leave_root_fail_their_item(
    folder: Path, tmp_path_factory: pytest.TempPathFactory
) -> None:
    outside = tmp_path_factory.mktemp("outside") / "secret.txt"
    outside.write_bytes(b"secret")
    (folder / "link.bin").symlink_to(outside)
    (folder / "sub" / "ok.bin").write_bytes(b"ok")
    out = read_all(
        FileDataset(["link.bin", "../outside/secret.txt", str(outside), "sub/ok.bin"], root=folder)
    )
    assert [type(item) for item in out[:3]] == [PermissionError] * 3
    assert all("leaves root" in str(item) for item in out[:3])
    assert out[3] == b"ok"


def test_template_values_that_could_leave_their_component_are_refused(folder: Path) -> None:
    for value in ("../x", "a/b", "a\\b", "..", ".", "x\x00"):
        with pytest.raises(ValueError, match="could leave"):
            FileDataset(Template("{name}.bin", name=[value]), root=folder)


def test_max_bytes_is_checked_before_reading(folder: Path) -> None:
    out = read_all(FileDataset(["002.bin", "003.bin"], root=folder, max_bytes=2000))
    assert out[0] == b"\x02" * 2000
    assert type(out[1]) is ValueError
    assert "3000 bytes, over max_bytes=2000" in str(out[1])


def test_an_unreadable_file_is_a_permission_error(folder: Path) -> None:
    """Run as root, the read happens in a child without CAP_DAC_OVERRIDE (setpriv), since root
    ignores mode bits; as another user, the mode bits alone decide."""
    secret = folder / "secret.bin"
    secret.write_bytes(b"no")
    secret.chmod(0)
    script = textwrap.dedent(
        f"""
        from asyncloader import DataLoader, FileDataset
        try:
            list(DataLoader(FileDataset([{str(secret)!r}])))
        except PermissionError as error:
            print("PermissionError", error)
        """
    )
    command = [sys.executable, "-c", script]
    if os.geteuid() == 0:
        command = ["setpriv", "--bounding-set=-dac_override,-dac_read_search", *command]
    result = subprocess.run(command, capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("PermissionError"), result.stdout
    assert "after 1 attempt" in result.stdout


@pytest.mark.parametrize(("num_workers", "item_concurrency"), [(0, 1), (2, 3)])
def test_mapped_files_are_read_only_maps_of_their_contents(
    folder: Path, num_workers: int, item_concurrency: int
) -> None:
    data = FileDataset(Template("{index:03d}.bin"), root=folder, length=6, mmap=True)
    items = read_all(data, num_workers=num_workers, item_concurrency=item_concurrency)
    assert items[0] == b""  # an empty file cannot be mapped: its item is empty bytes
    assert [bytes(item) for item in items] == [bytes([i]) * (i * 1000) for i in range(6)]
    assert all(type(item) is mmap.mmap for item in items[1:])
    with pytest.raises(TypeError):
        items[1][0] = 7  # read-only: a write would reach the file
    assert np.frombuffer(items[5], dtype=np.uint8).sum() == 5 * 5000  # no copy needed
    assert (folder / "001.bin").read_bytes() == b"\x01" * 1000


def test_mapped_files_keep_the_limits_and_errors_of_read_files(folder: Path) -> None:
    data = FileDataset(
        ["002.bin", "003.bin", "nope.bin", "sub"], root=folder, max_bytes=2000, mmap=True
    )
    out = read_all(data)
    assert bytes(out[0]) == b"\x02" * 2000
    assert type(out[1]) is ValueError
    assert "3000 bytes, over max_bytes=2000" in str(out[1])
    assert type(out[2]) is FileNotFoundError
    assert isinstance(out[3], IsADirectoryError)


def test_mapped_bytes_are_counted_in_the_statistics(folder: Path) -> None:
    data = FileDataset(["004.bin", "005.bin"], root=folder, mmap=True)
    with DataLoader(
        data, batch_size=2, collate_fn=list, num_workers=1, item_concurrency=2
    ) as loader:
        assert [len(item) for batch in loader for item in batch] == [4000, 5000]
        assert loader.stats().bytes == 9000


def test_mapped_items_kept_past_the_descriptor_limit(tmp_path: Path) -> None:
    for n in range(300):
        (tmp_path / f"{n}.bin").write_bytes(bytes([n % 251]) * 100)
    data = FileDataset([f"{n}.bin" for n in range(300)], root=tmp_path, mmap=True)
    before = len(os.listdir("/proc/self/fd"))
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (before + 200, hard))
    kept: list[Any] = []
    try:
        for n in range(300):
            try:
                kept.append(data[n])
            except OSError as error:
                kept.append(error)
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
    # Each item is checked as its own: a descriptor that the suite's other threads close
    # meanwhile (a socket of an earlier test) can let an item past the first failure map.
    mapped = {n: item for n, item in enumerate(kept) if isinstance(item, mmap.mmap)}
    assert all(bytes(item) == bytes([n % 251]) * 100 for n, item in mapped.items())
    if sys.version_info >= (3, 13):  # a map keeps no descriptor
        assert len(mapped) == 300
        assert len(os.listdir("/proc/self/fd")) == before
    else:  # each map keeps one: the items past the limit fail, saying why
        assert 150 < len(mapped) < 300
        failed = {n: item for n, item in enumerate(kept) if isinstance(item, OSError)}
        assert len(failed) == 300 - len(mapped)
        assert all("mmap=True keeps a descriptor open" in str(error) for error in failed.values())
        assert all(f"'{n}.bin'" in str(error) for n, error in failed.items())


def test_mmap_must_be_a_bool(folder: Path) -> None:
    with pytest.raises(TypeError, match="mmap must be True or False, got 'yes'"):
        FileDataset(["001.bin"], root=folder, mmap="yes")  # type: ignore[arg-type]
    assert "mmap=True" in repr(FileDataset(["001.bin"], root=folder, mmap=True))
