"""The built-in datasets against their limits and peers, interleaved in one run.

1. HTTP: 16 KiB items behind 20 ms of latency (a local aiohttp server in its own process), at
   64 and 256 requests in flight (as 4 batches of 64 at once, and as 16 batches with 16 items
   of each in flight): items/s as a fraction of in-flight / latency, against a bare
   asyncio + aiohttp loop at the same concurrency, and against torch DataLoader with 8 worker
   processes fetching the same URLs (one keep-alive connection per worker).
2. Files: 4 MiB files, FileDataset (8 I/O threads) against a plain single-threaded read loop,
   and against aiofiles at the same concurrency (the measurement behind FileDataset's design).
3. S3 (moto on 127.0.0.1), 16 KiB objects, 64 in flight: ObjectStoreDataset against obstore
   called directly with the same concurrency.

Run: ``.venv/bin/python benches/bench_datasets.py [--repeats R] [--only http|files|s3]``.
"""

from __future__ import annotations

import argparse
import asyncio
import http.client
import os
import tempfile
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any
from urllib.parse import urlsplit

import torch

from asyncloader import DataLoader, FileDataset, HttpDataset, ObjectStoreDataset, Template
from asyncloader._demo import serve_samples

from _common import interleave, median, save, table, timed

LATENCY_S = 0.020
ITEM_FLOATS = 4096  # 16 KiB


def http_section(repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    with serve_samples(LATENCY_S, ITEM_FLOATS) as url:
        for in_flight in (64, 256):
            items = in_flight * 60

            def ours(n: int = items, k: int = in_flight, batches: int = 4) -> int:
                data = HttpDataset(Template(url + "/samples/{index}"), length=n)
                with DataLoader(
                    data,
                    batch_size=64,
                    collate_fn=list,
                    num_workers=batches,
                    item_concurrency=k // batches,
                ) as loader:
                    return sum(len(batch) for batch in loader)

            def ours_16(n: int = items, k: int = in_flight) -> int:
                return ours(n, k, batches=16)

            def bare(n: int = items, k: int = in_flight) -> int:
                return asyncio.run(_bare_aiohttp(url, n, k))

            def torch_8(n: int = in_flight * 6) -> int:
                loader: torch.utils.data.DataLoader[Any] = torch.utils.data.DataLoader(
                    _TorchHttp(url, n),  # type: ignore[arg-type,unused-ignore]
                    batch_size=64,
                    num_workers=8,
                    collate_fn=list,
                )
                return sum(len(batch) for batch in loader)

            systems: dict[str, Callable[[], float]] = {
                "asyncloader HttpDataset": lambda f=ours: timed(f),  # type: ignore[misc]
                "asyncloader HttpDataset, 16 batches": lambda f=ours_16: timed(f),  # type: ignore[misc]
                "bare asyncio + aiohttp": lambda f=bare: timed(f),  # type: ignore[misc]
            }
            if in_flight == 64:
                systems["torch DataLoader, 8 workers"] = lambda f=torch_8: timed(f)  # type: ignore[misc]
            figures = interleave(systems, repeats)
            medians = {name: median(values) for name, values in figures.items()}
            limit = in_flight / LATENCY_S
            rows = [
                (name, value, f"{value / limit:.2f} of the limit")
                for name, value in medians.items()
            ]
            print(
                f"\n### HTTP, 16 KiB items, 20 ms, {in_flight} in flight (limit {limit:,.0f}/s)\n"
            )
            print(table(rows))
            best = max(
                medians["asyncloader HttpDataset"], medians["asyncloader HttpDataset, 16 batches"]
            )
            ratios = {
                "of_limit": best / limit,
                "of_bare": best / medians["bare asyncio + aiohttp"],
            }
            if "torch DataLoader, 8 workers" in medians:
                ratios["vs_torch_8"] = best / medians["torch DataLoader, 8 workers"]
            print("\n" + ", ".join(f"{k}: {v:.2f}" for k, v in ratios.items()))
            results[f"in_flight_{in_flight}"] = {
                "items_per_s": figures,
                "medians": medians,
                **ratios,
            }
    return results


async def _bare_aiohttp(url: str, items: int, in_flight: int) -> int:
    import aiohttp

    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        indices = iter(range(items))

        async def lane() -> None:
            for index in indices:
                async with session.get(f"{url}/samples/{index}") as response:
                    await response.read()

        await asyncio.gather(*(lane() for _ in range(in_flight)))
    return items


class _TorchHttp:
    """A map-style dataset that GETs each item over one keep-alive connection per worker."""

    def __init__(self, url: str, length: int) -> None:
        self.netloc = urlsplit(url).netloc
        self.length = length
        self.connection: http.client.HTTPConnection | None = None

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> bytes:
        if self.connection is None:
            self.connection = http.client.HTTPConnection(self.netloc, timeout=30)
        self.connection.request("GET", f"/samples/{index}")
        return self.connection.getresponse().read()


def files_section(repeats: int) -> dict[str, Any]:
    results: dict[str, Any] = {}
    for label, count, size in (("4 MiB", 128, 4 * 2**20), ("16 KiB", 4096, 16 * 2**10)):
        with tempfile.TemporaryDirectory() as folder:
            for i in range(count):
                with open(os.path.join(folder, f"{i:05d}.bin"), "wb") as file:
                    file.write(os.urandom(size))
            results[label] = _files_run(folder, label, count, repeats)
    return results


def _files_run(folder: str, label: str, count: int, repeats: int) -> dict[str, Any]:
    names = [f"{i:05d}.bin" for i in range(count)]
    # One loader for every epoch, as in training: its threads are started once.
    loader = DataLoader(
        FileDataset(names, root=folder),
        batch_size=16,
        collate_fn=list,
        num_workers=2,
        item_concurrency=4,
    )

    def ours() -> int:
        return sum(len(item) for batch in loader for item in batch)

    def plain() -> int:
        total = 0
        for name in names:
            with open(os.path.join(folder, name), "rb") as file:
                total += len(file.read())
        return total

    def plain_held() -> int:
        """The plain loop, keeping each batch of 16 alive as a loader's consumer does."""
        total = 0
        for start in range(0, len(names), 16):
            batch = []
            for name in names[start : start + 16]:
                with open(os.path.join(folder, name), "rb") as file:
                    batch.append(file.read())
            total += sum(len(item) for item in batch)
        return total

    def eight_in_flight(read: Callable[[str], Any]) -> int:
        """Each file read by ``read`` with 8 at once, on a loop with 8 executor threads."""

        async def all_files() -> int:
            asyncio.get_running_loop().set_default_executor(ThreadPoolExecutor(8))
            semaphore = asyncio.Semaphore(8)

            async def bounded(name: str) -> int:
                async with semaphore:
                    size: int = await read(os.path.join(folder, name))
                    return size

            return sum(await asyncio.gather(*(bounded(name) for name in names)))

        return asyncio.run(all_files())

    async def aiofiles_read(path: str) -> int:
        import aiofiles

        async with aiofiles.open(path, "rb") as file:  # a thread hop for open, read, close
            return len(await file.read())

    def whole_file(path: str) -> int:
        with open(path, "rb", buffering=0) as file:
            return len(file.read())

    async def one_hop_read(path: str) -> int:
        return await asyncio.get_running_loop().run_in_executor(None, whole_file, path)

    def with_aiofiles() -> int:
        return eight_in_flight(aiofiles_read)

    def with_one_hop() -> int:
        return eight_in_flight(one_hop_read)

    with loader:
        ours()  # warm: threads started, page cache filled
        figures = interleave(
            {
                "asyncloader FileDataset (8 in flight)": lambda: timed(ours) / 2**20,
                "plain read loop (1 thread)": lambda: timed(plain) / 2**20,
                "plain read loop, batches of 16 held": lambda: timed(plain_held) / 2**20,
                "aiofiles (8 in flight)": lambda: timed(with_aiofiles) / 2**20,
                "one thread hop per file (8 in flight)": lambda: timed(with_one_hop) / 2**20,
            },
            repeats,
        )
    medians = {name: median(values) for name, values in figures.items()}
    print(f"\n### Files, {count} x {label}, page cache warm (MiB/s)\n")
    print(table([(name, value, "MiB/s") for name, value in medians.items()]))
    ours_median = medians["asyncloader FileDataset (8 in flight)"]
    ratios = {
        "vs_plain_loop": ours_median / medians["plain read loop (1 thread)"],
        "vs_plain_held": ours_median / medians["plain read loop, batches of 16 held"],
        "vs_aiofiles": ours_median / medians["aiofiles (8 in flight)"],
        "one_hop_vs_aiofiles": medians["one thread hop per file (8 in flight)"]
        / medians["aiofiles (8 in flight)"],
    }
    print("\n" + ", ".join(f"{k}: {v:.2f}" for k, v in ratios.items()))
    return {"mib_per_s": figures, "medians": medians, **ratios}


def s3_section(repeats: int) -> dict[str, Any]:
    import boto3
    import obstore
    from moto.server import ThreadedMotoServer

    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    creds = {"access_key_id": "testing", "secret_access_key": "testing", "region": "us-east-1"}
    client = boto3.client(
        "s3",
        endpoint_url=endpoint,
        aws_access_key_id="testing",
        aws_secret_access_key="testing",
        region_name="us-east-1",
    )
    client.create_bucket(Bucket="bench")
    count = 1024
    blob = os.urandom(16 * 1024)
    for i in range(count):
        client.put_object(Bucket="bench", Key=f"o/{i:05d}", Body=blob)
    keys = [f"o/{i:05d}" for i in range(count)]
    options: dict[str, Any] = {"endpoint": endpoint, "allow_http": True, **creds}
    try:

        def ours() -> int:
            data = ObjectStoreDataset("s3://bench", keys, **options)
            with DataLoader(
                data, batch_size=64, collate_fn=list, num_workers=4, item_concurrency=16
            ) as loader:
                return sum(len(batch) for batch in loader)

        def direct() -> int:
            from asyncloader import Retry
            from asyncloader.datasets._objectstore import open_store

            store = open_store("s3://bench", Retry(), None, options)

            async def run() -> int:
                names = iter(keys)

                async def lane() -> None:
                    for key in names:
                        result = await obstore.get_async(store, key)
                        await result.bytes_async()

                await asyncio.gather(*(lane() for _ in range(64)))
                return count

            return asyncio.run(run())

        figures = interleave(
            {
                "asyncloader ObjectStoreDataset": lambda: timed(ours),
                "obstore directly": lambda: timed(direct),
            },
            repeats,
        )
    finally:
        client.close()
        server.stop()
    medians = {name: median(values) for name, values in figures.items()}
    print("\n### S3 (moto), 16 KiB objects, 64 in flight (objects/s)\n")
    print(table(list((name, value, "") for name, value in medians.items())))
    ratio = medians["asyncloader ObjectStoreDataset"] / medians["obstore directly"]
    print(f"\nof obstore directly: {ratio:.2f}")
    return {"objects_per_s": figures, "medians": medians, "of_obstore": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--only", choices=["http", "files", "s3"])
    args = parser.parse_args()
    sections = {"http": http_section, "files": files_section, "s3": s3_section}
    results = {}
    for name, section in sections.items():
        if args.only in (None, name):
            started = time.perf_counter()
            results[name] = section(args.repeats)
            print(f"({name}: {time.perf_counter() - started:.0f} s)")
    print(
        f"\nresults: {save('datasets' if args.only is None else f'datasets-{args.only}', results)}"
    )


if __name__ == "__main__":
    main()
