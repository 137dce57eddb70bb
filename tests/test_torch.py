"""Torch users: their datasets, their tensors and pin_memory work as they expect.

torch is optional for users and pinned (torch==2.13.0) for the tests; its CPU wheel exists on
this project's machines for Python 3.11 only, the version CI runs.
"""

from __future__ import annotations

import gc
import os
import random
import threading
import warnings
from typing import Any

import numpy as np
import pytest
import torch

from asyncloader import DataLoader, DistributedSampler, default_collate
from asyncloader.testing import assert_equal_output_after_checkpoint

from .datasets import AsyncData, SyncData


def test_tensors_are_stacked_with_torch() -> None:
    batch = default_collate([torch.ones(2), torch.zeros(2)])
    assert isinstance(batch, torch.Tensor)
    assert batch.shape == (2, 2)


class TorchStyle(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):  # type: ignore[misc,unused-ignore]
    """An unmodified torch map-style dataset."""

    def __len__(self) -> int:
        return 10

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        return torch.full((3,), float(index)), index % 2


@pytest.mark.parametrize("num_workers", [0, 2])
def test_a_torch_dataset_works_unchanged_and_matches_torchs_loader(num_workers: int) -> None:
    ours = list(DataLoader(TorchStyle(), batch_size=4, num_workers=num_workers))
    theirs = list(torch.utils.data.DataLoader(TorchStyle(), batch_size=4))
    assert len(ours) == len(theirs) == 3
    for (x, y), (tx, ty) in zip(ours, theirs, strict=True):
        assert torch.equal(x, tx)
        assert y.tolist() == ty.tolist()


def test_torch_tensor_dataset_with_getitems() -> None:
    data = torch.utils.data.TensorDataset(torch.arange(10.0))
    batches = list(DataLoader(data, batch_size=5, collate_fn=list))
    assert len(batches) == 2
    assert len(batches[0]) == 5


class Pinnable:
    """A custom batch type that pins itself, as torch's docs have users write."""

    def __init__(self, pinned: bool = False) -> None:
        self.pinned = pinned

    def pin_memory(self) -> Pinnable:
        return Pinnable(pinned=True)


class Rows(list[Any]):
    """A list type whose constructor takes no items."""

    def __init__(self, name: str) -> None:
        super().__init__()
        self.name = name


def test_pin_batch_keeps_the_batchs_types_and_pins_a_type_that_pins_itself() -> None:
    # pin_memory=True runs only where CUDA is, so the function is checked alone (a custom
    # value stands for a tensor). A batch's own pin_memory() was never called (torch calls
    # it: its docs' way to pin a custom batch), a mapping became a plain dict, and a list
    # type whose constructor takes no items raised TypeError.
    from asyncloader._pin import pin_batch

    from .test_collate import Encoding

    assert pin_batch(Pinnable()).pinned
    encoded = pin_batch(Encoding({"ids": Pinnable(), "text": "a"}, "tokens"))
    assert type(encoded) is Encoding
    assert encoded.to("cuda") == "tokens on cuda"
    assert encoded["ids"].pinned
    assert encoded["text"] == "a"
    rows = Rows("r")
    rows.extend([Pinnable(), 3])
    pinned_rows = pin_batch(rows)
    assert type(pinned_rows) is Rows
    assert pinned_rows.name == "r"
    assert pinned_rows[0].pinned
    assert not rows[0].pinned  # the batch given is not changed in place
    x, y = pin_batch((Pinnable(), [Pinnable()]))
    assert x.pinned
    assert y[0].pinned


def test_pin_memory_without_cuda_warns_and_pins_nothing() -> None:
    assert not torch.cuda.is_available()  # this machine: the warning path is the one to test
    with pytest.warns(UserWarning, match="pin_memory"):
        loader = DataLoader(SyncData(4), batch_size=2, pin_memory=True, num_workers=1)
    with loader:
        assert [b.tolist() for b in loader] == [[0, 1], [2, 3]]


@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize("n", [10, 11, 12])
def test_ranks_take_disjoint_shares_like_torch(n: int, drop_last: bool) -> None:
    for shuffle in (False, True):
        shares = []
        for rank in range(3):
            ours = list(
                DistributedSampler(3, rank, shuffle, seed=1, drop_last=drop_last).indices(n, 0)
            )
            shares.append(ours)
            if not shuffle:
                sampler: Any = torch.utils.data.DistributedSampler(
                    range(n),  # type: ignore[arg-type,unused-ignore]
                    num_replicas=3,
                    rank=rank,
                    shuffle=False,
                    drop_last=drop_last,
                )
                theirs = list(sampler)
                assert ours == theirs
        assert len({len(share) for share in shares}) == 1
        flat = [i for share in shares for i in share]
        if drop_last:
            assert len(set(flat)) == len(flat) == n - n % 3
        else:
            assert set(flat) == set(range(n))
            assert len(flat) == -(-n // 3) * 3


def test_torch_shares_the_memory_of_a_batch() -> None:
    from asyncloader import ImageCollator

    from .images import picture

    collate = ImageCollator(buffers=2, dtype=np.float32)
    batch = collate([picture(8, 10, seed=i) for i in range(4)])
    through_numpy = torch.from_numpy(batch)
    through_dlpack = torch.utils.dlpack.from_dlpack(batch)
    through_numpy[0, 0, 0, 0] = 42.0
    assert batch[0, 0, 0, 0] == 42.0
    assert through_dlpack[0, 0, 0, 0] == 42.0
    batch[1, 1, 1, 1] = -1.0
    assert through_numpy[1, 1, 1, 1] == -1.0
    where = batch.ctypes.data
    del batch
    gc.collect()
    # The tensors still hold the memory: it is not reused under them.
    other = collate([picture(8, 10, seed=i) for i in range(4)])
    assert other.ctypes.data != where
    assert through_numpy[0, 0, 0, 0] == 42.0


def test_batches_from_worker_processes_are_shared_with_torch_and_kept_while_it_holds_them() -> None:
    from asyncloader import ImageCollator

    from . import proc_data

    loader = DataLoader(
        proc_data.Images(48), batch_size=4, cpu_processes=1, collate_fn=ImageCollator()
    )
    procs = loader._runtime_here().procs
    assert procs is not None
    assert procs.wait_ready(30.0)  # the batches come from a worker, not the starting threads
    with loader:
        iterator = iter(loader)
        batch = next(iterator)
        tensor = torch.from_numpy(batch)
        assert tensor.data_ptr() == batch.ctypes.data  # no copy on the way to torch
        expected = tensor.clone()
        del batch
        gc.collect()
        rest = list(iterator)  # the segment under the tensor is not reused meanwhile
        assert torch.equal(tensor, expected)
        assert all(other.ctypes.data != tensor.data_ptr() for other in rest)


def test_a_tensor_from_a_worker_goes_out_of_band_into_shared_memory() -> None:
    # As a worker packs a batch: a CPU tensor's data goes into a segment, not into the
    # pickle. torch's own pickling puts it in band, and a misplaced method once left every
    # tensor batch to it, with no test failing.
    from asyncloader._shared import Arena, Mapped

    arena = Arena()
    tensor = torch.arange(250_000, dtype=torch.float32).reshape(500, 500)
    data, refs, new, dropped = arena.pack({"x": tensor, "y": torch.arange(4)})
    assert len(data) < 1_000, len(data)  # references only: no tensor data in band
    assert sum(nbytes for _, _, nbytes in refs) >= tensor.numel() * 4
    mapped = Mapped(os.dup(arena.control_fd))
    mapped.update(new, arena.hand_over([number for number, _ in new]), dropped)
    got = mapped.unpack(data, refs)
    assert type(got["x"]) is torch.Tensor
    assert torch.equal(got["x"], tensor)
    assert got["y"].tolist() == [0, 1, 2, 3]


def _from_processes_and_threads(dataset: Any) -> list[tuple[Any, Any]]:
    """Each item of ``dataset`` as a worker process sent it, beside the same item made on a
    CPU thread (batches of 2, kept as lists)."""

    def run(**mode: Any) -> list[list[Any]]:
        with DataLoader(dataset, batch_size=2, collate_fn=list, **mode) as loader:
            return list(loader)

    pairs = zip(run(cpu_processes=1), run(cpu_threads=1), strict=True)
    return [item for ours, threads in pairs for item in zip(ours, threads, strict=True)]


class Layouts(torch.utils.data.Dataset[dict[str, torch.Tensor]]):  # type: ignore[misc,unused-ignore]
    """Tensors of every layout torch's own worker processes send: sparse (COO, CSR) beside
    strided ones, a strided view, lazily conjugated or negated views, and a tensor that
    requires grad."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        dense = torch.eye(3) * (index + 1)
        return {
            "coo": dense.to_sparse(),
            "csr": dense.to_sparse_csr(),
            "strided": dense,
            "view": torch.arange(12.0).reshape(3, 4).t() + index,
            "grad": torch.ones(2, requires_grad=True),
            # lazily conjugated, and a view of one whose sign is lazy: NumPy has neither bit
            "conj": (dense * (1 + 2j)).conj(),
            "neg": (dense * (1 + 2j)).conj().imag,
        }


@pytest.mark.filterwarnings("ignore:Sparse CSR tensor support is in beta")
def test_tensors_of_every_layout_cross_from_worker_processes() -> None:
    # A sparse tensor was sent as if strided: "unsupported memory format option Contiguous"
    # failed every batch that held one, and a conjugated view "Can't call numpy() on Tensor
    # that has conjugate bit set" (torch's DataLoader sends both).
    for got, want in _from_processes_and_threads(Layouts()):
        assert isinstance(got, dict), got
        for key, tensor in want.items():
            assert got[key].layout == tensor.layout, key
            assert got[key].requires_grad == tensor.requires_grad, key
            assert torch.equal(got[key].to_dense(), tensor.to_dense()), key


class Dtypes(torch.utils.data.Dataset[dict[str, torch.Tensor]]):  # type: ignore[misc,unused-ignore]
    """Tensors of the dtypes NumPy lacks or torch's own pickling cannot load again (16- to
    64-bit unsigned, float8, complex32: "UntypedStorage has no attribute 'dtype'"), beside
    bfloat16, a quantized and a nested tensor."""

    def __len__(self) -> int:
        return 4

    def __getitem__(self, index: int) -> dict[str, torch.Tensor]:
        values = torch.arange(6).reshape(2, 3) + index
        kinds = ["uint16", "uint32", "uint64", "float8_e4m3fn", "float8_e5m2", "bfloat16"]
        item = {kind: values.to(getattr(torch, kind)) for kind in kinds}
        item["complex32"] = values.to(torch.complex64).to(torch.complex32)
        item["quantized"] = torch.quantize_per_tensor(values.float(), 0.5, 2, torch.quint8)
        item["nested"] = torch.nested.nested_tensor([torch.ones(2) * index, torch.ones(3)])
        item["scalar"] = torch.tensor(index, dtype=torch.uint16)
        return item


def _bytes(tensor: torch.Tensor) -> list[int]:
    values: list[int] = tensor.contiguous().reshape(-1).view(torch.uint8).tolist()
    return values


@pytest.mark.filterwarnings("ignore:ComplexHalf support is experimental")
@pytest.mark.filterwarnings("ignore:torch.quantize_per_tensor")
@pytest.mark.filterwarnings("ignore:The PyTorch API of nested tensors is in prototype")
def test_tensors_of_every_dtype_cross_from_worker_processes() -> None:
    # torch's DataLoader sends them all. Ours failed every batch that held one: a uint16
    # depth map or 16-bit image ("UntypedStorage has no attribute 'dtype'", as torch's own
    # pickling of such a tensor fails to load), or a nested tensor ("NestedTensorImpl
    # doesn't support sizes").
    for got, want in _from_processes_and_threads(Dtypes()):
        for key, tensor in want.items():
            assert got[key].dtype == tensor.dtype, key
            if tensor.is_nested:
                assert got[key].is_nested, key
                for part, wanted in zip(got[key].unbind(), tensor.unbind(), strict=True):
                    assert torch.equal(part, wanted), key
            elif tensor.is_quantized:
                assert torch.equal(got[key].dequantize(), tensor.dequantize()), key
            else:
                assert got[key].shape == tensor.shape, key
                assert _bytes(got[key]) == _bytes(tensor), key


@pytest.mark.parametrize("dtype", ["uint16", "float8_e4m3fn", "float32"])
def test_a_dataset_of_tensors_of_any_dtype_is_sent_to_worker_processes(dtype: str) -> None:
    # A TensorDataset of a uint16 tensor (16-bit images): torch's pickle of the dataset
    # could not be loaded by the workers ("UntypedStorage has no attribute 'dtype'"), and
    # the epoch failed; torch's loader reads it.
    values = torch.arange(4096 * 8).reshape(8, 4096).to(getattr(torch, dtype))
    dataset = torch.utils.data.TensorDataset(values)
    with DataLoader(dataset, batch_size=2, cpu_processes=1) as loader:
        procs = loader._runtime_here().procs
        assert procs is not None
        assert procs.wait_ready(30.0)
        batches = [batch for [batch] in loader]
    assert [batch.dtype for batch in batches] == [values.dtype] * 4
    assert _bytes(torch.cat(batches)) == _bytes(values)


def test_an_expanded_tensor_in_a_dataset_is_sent_as_its_few_elements() -> None:
    # An expanded view (stride 0) repeats a few elements: torch pickles those, as it did for
    # the dataset before its tensors went out of band. Sent whole, 32 MiB of memory for the
    # workers held what 32 bytes say.
    expanded = torch.arange(8.0).reshape(1, 8).expand(2**20, 8)
    loader = DataLoader(torch.utils.data.TensorDataset(expanded), batch_size=4, cpu_processes=1)
    with loader:
        assert loader._work is not None
        assert loader._work.layout[2] < 2**20
        [first] = next(iter(loader))
    assert torch.equal(first, expanded[:4])


@pytest.mark.parametrize("how", ["torch.load(mmap=True)", "torch.from_file(shared=True)"])
def test_a_tensor_that_maps_a_file_is_sent_as_the_file(tmp_path: Any, how: str) -> None:
    # Its array was copied whole into the work's memory as the loader was built; now each
    # worker maps the same file (a private mapping of torch.load's, not written to, too).
    values = torch.arange(1 << 20, dtype=torch.float32).reshape(-1, 256)
    path = str(tmp_path / "values")
    if how.startswith("torch.load"):
        torch.save(values, path)
        mapped = torch.load(path, mmap=True)
    else:
        values.numpy().tofile(path)
        mapped = torch.from_file(path, shared=True, size=values.numel()).reshape(-1, 256)
    loader = DataLoader(torch.utils.data.TensorDataset(mapped), batch_size=64, cpu_processes=1)
    with loader:
        assert loader._work is not None
        assert loader._work.layout[2] < 64 << 10  # not its 4 MiB
        got = torch.cat([batch for [batch] in loader])
    assert torch.equal(got, values)


def test_many_tensors_of_one_mapped_file_read_its_page_counts_once(
    tmp_path: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Each of them read /proc/self/smaps again, to see that its mapping was not written to:
    # 500 tensors of one torch.load(mmap=True) took 11 s to build the loader (by hand).
    from asyncloader import _file_mapped

    reads: list[int] = []
    unwritten = _file_mapped._unwritten

    def counted(start: int) -> bool:
        reads.append(start)
        return unwritten(start)

    monkeypatch.setattr(_file_mapped, "_unwritten", counted)
    path = str(tmp_path / "many.pt")
    torch.save({f"t{i}": torch.full((16384 + i,), float(i)) for i in range(100)}, path)
    tensors = list(torch.load(path, mmap=True).values())
    with DataLoader(tensors, batch_size=10, cpu_processes=1, collate_fn=list) as loader:
        assert loader._work is not None
        assert loader._work.layout[2] < 64 << 10  # each goes as the file's range
        assert [float(batch[0][0]) for batch in loader] == [float(i) for i in range(0, 100, 10)]
    assert len(reads) == 1  # one mapping, one read


def _datapipe() -> Any:
    from torch.utils.data.datapipes.iter import IterableWrapper

    return IterableWrapper(range(40)).shuffle(buffer_size=10)


def test_a_datapipes_shuffles_are_drawn_from_the_seed_and_the_epoch() -> None:
    # Unseeded, each drew from torch's global generator: two loaders of one seed, or an
    # epoch read again to resume it, gave other orders (torch's loader seeds them from its
    # generator).
    def run(seed: int, workers: int) -> list[list[list[int]]]:
        with DataLoader(_datapipe(), batch_size=8, seed=seed, num_workers=workers) as loader:
            return [[batch.tolist() for batch in loader] for _ in range(2)]

    first = run(3, 0)
    assert run(3, 4) == first
    assert first[0] != first[1]  # each epoch its own order
    assert run(4, 0) != first
    assert sorted(item for batch in first[1] for item in batch) == list(range(40))

    def make() -> DataLoader:
        return DataLoader(_datapipe(), batch_size=8, seed=3, num_workers=2)

    with pytest.warns(UserWarning, match="exact only if it gives the same items"):
        assert_equal_output_after_checkpoint(make, epochs=2)
    with pytest.raises(ValueError, match=r"shuffle: a datapipe shuffles itself.*apply_shuffle"):
        DataLoader(_datapipe(), shuffle=True)


def test_tensor_batches_cross_from_worker_processes_as_tensors() -> None:
    loader = DataLoader(TorchStyle(), batch_size=4, cpu_processes=1)
    with loader:
        ours = list(loader)
    theirs = list(torch.utils.data.DataLoader(TorchStyle(), batch_size=4))
    for (x, y), (tx, ty) in zip(ours, theirs, strict=True):
        assert type(x) is torch.Tensor
        assert torch.equal(x, tx)
        assert y.tolist() == ty.tolist()


class OpensPerWorker(torch.utils.data.Dataset[Any]):  # type: ignore[misc,unused-ignore]
    """torch's pattern for what each worker must open for itself (a database handle): its
    ``worker_init_fn`` (:func:`open_per_worker`) finds its copy of the dataset through
    ``get_worker_info()``. Each item says what its worker opened and what torch says of it."""

    def __init__(self) -> None:
        self.handle: str | None = None

    def __len__(self) -> int:
        return 8

    def __getitem__(self, index: int) -> tuple[str | None, int, int, bool]:
        info = torch.utils.data.get_worker_info()
        assert info is not None
        return self.handle, info.id, info.num_workers, info.seed == torch.initial_seed()


def open_per_worker(worker_id: int) -> None:
    info = torch.utils.data.get_worker_info()
    assert info is not None
    assert info.id == worker_id
    dataset = info.dataset
    assert isinstance(dataset, OpensPerWorker)
    dataset.handle = f"opened by worker {worker_id}"


def test_a_torch_worker_init_fn_finds_its_worker_and_dataset_as_in_torch() -> None:
    def items(loader: Any) -> set[tuple[str | None, int, int, bool]]:
        return {item for batch in loader for item in batch}

    ours = DataLoader(
        OpensPerWorker(),
        batch_size=2,
        collate_fn=list,
        cpu_processes=2,
        worker_init_fn=open_per_worker,
    )
    theirs = torch.utils.data.DataLoader(
        OpensPerWorker(),
        batch_size=2,
        collate_fn=list,
        num_workers=2,
        worker_init_fn=open_per_worker,
    )
    expected = {(f"opened by worker {n}", n, 2, True) for n in (0, 1)}
    with ours:
        assert items(ours) <= expected
        assert items(theirs) == expected
    assert torch.utils.data.get_worker_info() is None


class FirstDraws(torch.utils.data.Dataset[Any]):  # type: ignore[misc,unused-ignore]
    """In each worker process, its first item is the first draws of the global generators
    (NumPy's, Python's, torch's) in that process, made once ``workers`` processes have each
    begun one (so that every worker has work); every other item is ``None``."""

    def __init__(self, folder: str, workers: int) -> None:
        self.folder = folder
        self.workers = workers
        self.parent = os.getpid()

    def __len__(self) -> int:
        return 64

    def __getitem__(self, index: int) -> Any:
        if os.getpid() == self.parent or _drawn:
            return None
        _drawn.append(index)
        with open(os.path.join(self.folder, str(os.getpid())), "w"):
            pass
        for _ in range(3000):
            if len(os.listdir(self.folder)) >= self.workers:
                break
            threading.Event().wait(0.01)
        else:
            raise TimeoutError("the other worker processes took no item within 30 s")
        return os.getpid(), float(np.random.rand()), random.random(), float(torch.rand(()))


_drawn: list[int] = []
"""The item that drew, in this process."""


@pytest.mark.timeout(120)
def test_each_worker_process_draws_its_own_random_numbers(tmp_path: Any) -> None:
    # torch seeds NumPy, Python and torch afresh in each of its workers. Ours were forked from
    # one process, or started as fresh ones, each with the same generators: an augmentation
    # drawn with np.random or torch.rand was the same in every worker (the trap torch fixed).
    loader = DataLoader(
        FirstDraws(str(tmp_path), 2), batch_size=1, collate_fn=list, cpu_processes=2
    )
    with loader:
        procs = loader._runtime_here().procs
        assert procs is not None
        assert procs.wait_ready(30.0)
        draws = [item for _ in range(2) for [item] in loader if item is not None]
    assert len({pid for pid, *_ in draws}) == 2, draws
    for generator, name in enumerate(["numpy", "random", "torch"], 1):
        assert draws[0][generator] != draws[1][generator], (name, draws)


@pytest.mark.parametrize("wrapper", ["Subset", "ConcatDataset"])
def test_a_torch_wrapper_of_an_async_dataset_is_refused_saying_what_to_do(wrapper: str) -> None:
    # torch's Subset and ConcatDataset call an async dataset's __getitem__ and hand back its
    # coroutines unawaited. The batch was refused with "define it with 'async def'", which
    # the user cannot do to torch's class, and Subset's __getitems__ left every coroutine but
    # the first unclosed: "coroutine 'AsyncData.__getitem__' was never awaited".
    inner: Any = [AsyncData(10), AsyncData(4), AsyncData(4)]  # no torch Dataset, to mypy
    dataset: Any = (
        torch.utils.data.Subset(inner[0], [1, 3, 5, 7])
        if wrapper == "Subset"
        else torch.utils.data.ConcatDataset(inner[1:])
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with DataLoader(dataset, batch_size=2, num_workers=2) as loader:
            with pytest.raises(TypeError, match=f"{wrapper} wraps an async dataset") as raised:
                next(iter(loader))
            assert "sampler=" in str(raised.value)
        del raised
        gc.collect()
    assert [str(warning.message) for warning in caught] == []
