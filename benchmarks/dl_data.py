"""Deep-learning data paths of a worker (issue 25): each table is one function.

``decode``: decode + augment throughput of one worker (images/s). Ours: a
:class:`~cerebro_spark.training._prefetch.Prefetcher` with T threads, each building whole
batches of 64 from the rows of a held image column (``HeldColumn``: the encoded JPEGs end
to end) with ``decode_images`` + ``augment`` (random crop, padding size/8, and flip) +
``to_tensor`` (scaled, normalized). Against it: a ``torch.utils.data.DataLoader`` with T
worker processes over a map-style Dataset that reads the same Parquet file with pyarrow
and, per image, decodes with PIL, random-crops and flips with numpy and makes a normalized
tensor (batch size 64, default collate). Both shuffle, both use the dataset's per-channel
statistics. Each epoch reads every row once; the DataLoader's workers persist (their
start-up is not timed) and both run one untimed warm-up epoch; the table gives the median
of ``--epochs`` timed epochs, the two paths alternating. Torch runs one intra-op thread in
this process, as a pinned worker would (DataLoader workers do the same).

Data: real JPEG content without a download: random square patches of scikit-learn's two
bundled photos (``load_sample_images``), resized to the size, JPEG-encoded (quality 90)
with PIL, ``--rows`` rows written to one Parquet file (a binary ``image`` column and an
``int64`` ``label``).

    python benchmarks/dl_data.py [--tables decode] [--rows 2000] [--sizes 32,112]
        [--threads 1,2] [--epochs 5] [--data-dir DIR]
"""

from __future__ import annotations

import argparse
import io
import os
import platform
import shlex
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

from cerebro_spark.data import ColumnInfo, HeldColumn
from cerebro_spark.training._images import (
    Augmentation,
    augment,
    batch_seed,
    decode_images,
    normalization,
    to_tensor,
)
from cerebro_spark.training._prefetch import Prefetcher

BATCH = 64


def machine() -> str:
    model = "unknown CPU"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    cores = len(os.sched_getaffinity(0))
    load = os.getloadavg()[0]
    return (
        f"machine: nproc {cores}, {model}; Python {platform.python_version()}, torch "
        f"{torch.__version__}, Pillow {Image.__version__}; load average {load:.2f} at start"
    )


# --- data ---------------------------------------------------------------------------------


def write_images(path: Path, rows: int, size: int, seed: int) -> None:
    """Write ``rows`` JPEG patches of the sample photos, ``size`` px square, to Parquet."""
    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(image) for image in load_sample_images().images]
    blobs: list[bytes] = []
    for _ in range(rows):
        photo = photos[int(rng.integers(len(photos)))]
        side = int(rng.integers(size, min(3 * size, *photo.size) + 1))
        left = int(rng.integers(0, photo.width - side + 1))
        top = int(rng.integers(0, photo.height - side + 1))
        patch = photo.crop((left, top, left + side, top + side)).resize((size, size))
        buffer = io.BytesIO()
        patch.save(buffer, format="JPEG", quality=90)
        blobs.append(buffer.getvalue())
    labels = rng.integers(0, 10, size=rows)
    table = pa.table({"image": pa.array(blobs, type=pa.binary()), "label": labels})
    pq.write_table(table, path)


def held_column(path: Path, size: int) -> HeldColumn:
    """The file's ``image`` column as a worker holds it, with its per-channel statistics."""
    blobs = pq.read_table(path, columns=["image"]).column("image").to_pylist()
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(blob) for blob in blobs])
    values = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    info = ColumnInfo("image", "uint8", (3, size, size), kind="image", encoding="jpeg")
    column = HeldColumn(info, values, offsets)
    pixels = decode_images(column, np.arange(column.rows)).astype(np.float64) / 255.0
    stats = {
        "mean": pixels.mean(axis=(0, 2, 3)).tolist(),
        "std": pixels.std(axis=(0, 2, 3)).tolist(),
    }
    info = ColumnInfo(
        "image", "uint8", (3, size, size), kind="image", encoding="jpeg", statistics=stats
    )
    return HeldColumn(info, values, offsets)


# --- the two paths ------------------------------------------------------------------------


def ours_epoch(
    column: HeldColumn, augmentation: Augmentation, threads: int, epoch: int
) -> tuple[int, float]:
    """One epoch of batches built by the prefetcher; returns (images, seconds)."""
    mean, std = normalization(column.info, augmentation)
    order = np.random.default_rng(epoch).permutation(column.rows)
    batches = -(-column.rows // BATCH)

    def make(batch: int) -> torch.Tensor:
        rows = order[batch * BATCH : (batch + 1) * BATCH]
        images = decode_images(column, rows)
        images = augment(images, augmentation, batch_seed(0, epoch, 0, batch))
        return to_tensor(images, mean, std)

    start = time.perf_counter()
    seen = 0
    with Prefetcher(make, batches, threads=threads) as prefetcher:
        for tensor in prefetcher:
            seen += int(tensor.shape[0])
    return seen, time.perf_counter() - start


class ParquetImages(torch.utils.data.Dataset[tuple[torch.Tensor, int]]):
    """The usual map-style Dataset: pyarrow read, PIL decode, numpy crop/flip, tensor."""

    def __init__(self, path: Path, padding: int, mean: Any, std: Any) -> None:
        table = pq.read_table(path, columns=["image", "label"])
        self.images: list[bytes] = table.column("image").to_pylist()
        self.labels: list[int] = table.column("label").to_pylist()
        self.padding = padding
        self.mean = torch.tensor(mean, dtype=torch.float32).reshape(3, 1, 1)
        self.std = torch.tensor(std, dtype=torch.float32).reshape(3, 1, 1)
        self.rng: np.random.Generator | None = None

    def __len__(self) -> int:
        return len(self.images)

    def __getitem__(self, index: int) -> tuple[torch.Tensor, int]:
        if self.rng is None:
            info = torch.utils.data.get_worker_info()
            self.rng = np.random.default_rng(0 if info is None else info.seed)
        with Image.open(io.BytesIO(self.images[index])) as image:
            pixels = np.asarray(image.convert("RGB"))  # (H, W, 3)
        height, width, _ = pixels.shape
        p = self.padding
        padded = np.pad(pixels, ((p, p), (p, p), (0, 0)))
        top, left = self.rng.integers(0, 2 * p + 1, size=2)
        crop = padded[top : top + height, left : left + width]
        if self.rng.random() < 0.5:
            crop = crop[:, ::-1]
        tensor = torch.from_numpy(np.ascontiguousarray(crop.transpose(2, 0, 1)))
        tensor = (tensor.float().div_(255.0) - self.mean) / self.std
        return tensor, self.labels[index]


def loader_epoch(loader: torch.utils.data.DataLoader[Any]) -> tuple[int, float]:
    start = time.perf_counter()
    seen = 0
    for images, _labels in loader:
        seen += int(images.shape[0])
    return seen, time.perf_counter() - start


# --- tables -------------------------------------------------------------------------------


def decode_table(args: argparse.Namespace, data_dir: Path) -> None:
    sizes = [int(s) for s in args.sizes.split(",")]
    thread_counts = [int(t) for t in args.threads.split(",")]
    print(
        f"decode + augment, one worker: {args.rows} JPEG rows (quality 90) per size, batches of "
        f"{BATCH}, crop padding size/8 + flip + normalize; median of {args.epochs} epochs "
        "(images/s)"
    )
    print("| size px | T | ours img/s | DataLoader img/s | ours / DataLoader |")
    print("|--:|--:|--:|--:|--:|")
    for size in sizes:
        path = data_dir / f"images-{size}.parquet"
        if not path.exists():
            write_images(path, args.rows, size, seed=size)
        column = held_column(path, size)
        augmentation = Augmentation(crop_padding=max(size // 8, 1), flip=True)
        mean, std = normalization(column.info, augmentation)
        for threads in thread_counts:
            dataset = ParquetImages(path, augmentation.crop_padding, mean, std)
            loader = torch.utils.data.DataLoader(
                dataset,
                batch_size=BATCH,
                shuffle=True,
                num_workers=threads,
                persistent_workers=True,
            )
            ours_epoch(column, augmentation, threads, epoch=0)  # warm-up
            loader_epoch(loader)
            ours_rates: list[float] = []
            loader_rates: list[float] = []
            for epoch in range(1, args.epochs + 1):
                images, seconds = ours_epoch(column, augmentation, threads, epoch)
                ours_rates.append(images / seconds)
                images, seconds = loader_epoch(loader)
                loader_rates.append(images / seconds)
            del loader  # stops its worker processes
            ours = statistics.median(ours_rates)
            theirs = statistics.median(loader_rates)
            print(f"| {size} | {threads} | {ours:,.0f} | {theirs:,.0f} | {ours / theirs:.2f}x |")
            sys.stdout.flush()


TABLES: dict[str, Callable[[argparse.Namespace, Path], None]] = {"decode": decode_table}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="decode", help=f"comma-separated: {', '.join(TABLES)}")
    parser.add_argument("--rows", type=int, default=2000, help="images per size (default 2000)")
    parser.add_argument("--sizes", default="32,112", help="image sizes in px (default 32,112)")
    parser.add_argument("--threads", default="1,2", help="T: threads / workers (default 1,2)")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs (default 5)")
    parser.add_argument("--data-dir", help="where the Parquet files go (default: a temp dir)")
    args = parser.parse_args(argv)
    unknown = [name for name in args.tables.split(",") if name not in TABLES]
    if unknown:
        parser.error(f"unknown tables {unknown}; known: {', '.join(TABLES)}")
    return args


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.set_num_threads(1)
    command = " ".join(["python benchmarks/dl_data.py", *map(shlex.quote, sys.argv[1:])])
    print(f"command: {command}")
    print(machine())
    start = time.perf_counter()
    with tempfile.TemporaryDirectory() as scratch:
        data_dir = Path(args.data_dir or scratch)
        data_dir.mkdir(parents=True, exist_ok=True)
        for name in args.tables.split(","):
            print()
            TABLES[name](args, data_dir)
    load = os.getloadavg()[0]
    print(f"\n{time.perf_counter() - start:.1f} s; load average {load:.2f} at the end")


if __name__ == "__main__":
    main()
