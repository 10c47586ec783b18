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

``unit``: the data wait share of ResNet-18 train units (issue target <= 5 %) on 64 px
JPEG images prepared by ``prepare_dataset(kinds=KindOptions(image_columns=("image",)))``:
one train partition read with ``read_partition``, train units run with ``run_unit`` (params
``depth 18, width --width, batch_size 64``), without and with the spec's augmentation
(``crop_padding 4, flip``), with ``CEREBRO_INPUT_THREADS`` 0, 1, 2; each unit continues
the previous one's checkpoint. The table gives the median over ``--repeats`` units of unit
seconds, data wait seconds and their share; the configurations alternate unit by unit.

``residency``: what a worker holds of a partition against what is stored: a uint8 pixel
ARRAY column (3x32x32) and a JPEG image column, each prepared, one train partition read
with ``read_partition``; ``PartitionData.nbytes`` and the process's RSS growth over the
partition file's bytes and over the float32 equivalent of its pixels (issue: uint8 images
held at <= 1.05x their stored bytes).

``criteo``: Criteo-like rows (13 numbers, 26 string categories of cardinalities 10 to 10^6
spaced geometrically, Zipf-like frequencies, a seeded logistic label of a few columns):
``prepare_dataset`` throughput (rows/s, with its peak RSS growth) with ``KindOptions(
categorical=26 columns, vocabulary_limit=100_000, hash_buckets=--hash-buckets)``, then
training throughput (rows/s of one train unit on one partition, median of ``--repeats``)
of ``EmbeddingMLPSpec`` against ``MLPSpec`` of the same hidden sizes on the dense
equivalent (the 13 numbers and the 26 category ranks as float32).

    python benchmarks/dl_data.py [--tables decode,unit,residency,criteo] [--rows 2000]
        [--sizes 32,112] [--threads 1,2] [--epochs 5] [--data-dir DIR]
        [--unit-rows 640] [--width 0.25] [--repeats 3] [--criteo-rows 2000000]
        [--hash-buckets 1000]
"""

from __future__ import annotations

import argparse
import dataclasses
import gc
import io
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import torch
from PIL import Image
from sklearn.datasets import load_sample_images

from cerebro_spark.data import ColumnInfo, HeldColumn, KindOptions, prepare_dataset
from cerebro_spark.data import read_partition as read_held_partition
from cerebro_spark.store import open_store
from cerebro_spark.training import load_spec, run_unit
from cerebro_spark.training._images import (
    Augmentation,
    augment,
    batch_seed,
    decode_images,
    normalization,
    to_tensor,
)
from cerebro_spark.training._prefetch import Prefetcher
from cerebro_spark.units import UnitKind, UnitTask

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


# --- helpers of the unit, residency and criteo tables --------------------------------------


def rss_bytes() -> int:
    """This process's resident set size now (``/proc/self/status``)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
    return 0


class PeakRss:
    """The peak RSS of this process while the block runs, sampled every 20 ms."""

    def __init__(self) -> None:
        self.before = 0
        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    def _sample(self) -> None:
        while not self._stop.wait(0.02):
            self.peak = max(self.peak, rss_bytes())

    def __enter__(self) -> PeakRss:
        gc.collect()
        self.before = self.peak = rss_bytes()
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, rss_bytes())

    @property
    def growth(self) -> int:
        return self.peak - self.before


def photo_patches(rows: int, size: int, seed: int) -> tuple[list[bytes], np.ndarray]:
    """``rows`` JPEG patches (quality 90) of the sample photos and labels: the photo (0/1)
    times 5 plus the patch's row band (0..4)."""
    rng = np.random.default_rng(seed)
    photos = [Image.fromarray(image) for image in load_sample_images().images]
    blobs: list[bytes] = []
    labels = np.zeros(rows, dtype=np.int64)
    for row in range(rows):
        which = int(rng.integers(len(photos)))
        photo = photos[which]
        side = int(rng.integers(size, min(3 * size, *photo.size) + 1))
        left = int(rng.integers(0, photo.width - side + 1))
        top = int(rng.integers(0, photo.height - side + 1))
        patch = photo.crop((left, top, left + side, top + side)).resize((size, size))
        buffer = io.BytesIO()
        patch.save(buffer, format="JPEG", quality=90)
        blobs.append(buffer.getvalue())
        labels[row] = which * 5 + min(4, 5 * (top + side // 2) // photo.height)
    return blobs, labels


def train_task(spec: str, params: dict[str, Any], step: int, key: str | None) -> UnitTask:
    return UnitTask(
        kind=UnitKind.TRAIN,
        trial_id="t0",
        spec=spec,
        params=params,
        trial_seed=1,
        epoch=step,
        partition=0,
        step=0,
        epoch_units=1,
        checkpoint_in=key,
        checkpoint_out=f"{spec.rsplit(':', 1)[-1]}/{len(params)}-{step}.pt",
    )


# --- unit: data wait share of ResNet-18 train units --------------------------------------


def unit_table(args: argparse.Namespace, data_dir: Path) -> None:
    size = 64
    train_rows = args.unit_rows
    total = int(train_rows / 0.8) + 4
    blobs, labels = photo_patches(total, size, seed=64)
    table = pa.table({"image": pa.array(blobs, type=pa.binary()), "label": labels})
    store_dir = data_dir / "unit-store"
    shutil.rmtree(store_dir, ignore_errors=True)
    shutil.rmtree(data_dir / "unit-checkpoints", ignore_errors=True)
    manifest = prepare_dataset(
        table, str(store_dir), features=["image"], label="label", num_partitions=1, seed=0,
        task="classification", kinds=KindOptions(image_columns=("image",)),
    )  # fmt: skip
    dataset = store_dir / "datasets" / manifest.dataset_id
    data = read_held_partition(str(dataset), "train", 0, manifest=manifest)
    info = manifest.info
    store = open_store(str(data_dir / "unit-checkpoints"))
    base = {"depth": 18, "width": args.width, "batch_size": BATCH}
    augmented = {**base, "crop_padding": 4, "flip": True}
    configs = [
        (aug, threads) for aug in (False, True) for threads in (0, 1, 2)
    ]  # alternate unit by unit
    keys: dict[tuple[bool, int], str | None] = {c: None for c in configs}
    seconds: dict[tuple[bool, int], list[float]] = {c: [] for c in configs}
    waits: dict[tuple[bool, int], list[float]] = {c: [] for c in configs}
    spec = "cerebro_spark.training:ResNetSpec"
    previous = os.environ.get("CEREBRO_INPUT_THREADS")
    print(
        f"data wait of ResNet-18 (width {args.width}, small stem) train units, one worker: "
        f"{data.rows} rows of {size} px JPEG (quality 90) in one train partition, batches of "
        f"{BATCH}, torch at 1 intra-op thread; median of {args.repeats} units after one "
        "untimed warm-up unit per configuration (issue target: data wait <= 5 % of unit time)"
    )
    try:
        for step in range(args.repeats + 1):
            for aug, threads in configs:
                os.environ["CEREBRO_INPUT_THREADS"] = str(threads)
                params = augmented if aug else base
                task = train_task(spec, params, step, keys[(aug, threads)])
                task = dataclasses.replace(
                    task, checkpoint_out=f"resnet-{int(aug)}-{threads}/{step}.pt"
                )
                result = run_unit(task, data, store, info)
                keys[(aug, threads)] = task.checkpoint_out
                if step:
                    seconds[(aug, threads)].append(result.seconds)
                    waits[(aug, threads)].append(result.data_wait_seconds)
    finally:
        if previous is None:
            os.environ.pop("CEREBRO_INPUT_THREADS", None)
        else:
            os.environ["CEREBRO_INPUT_THREADS"] = previous
    print("| augmentation | input threads | unit s | data wait s | wait share | img/s |")
    print("|--|--:|--:|--:|--:|--:|")
    for aug, threads in configs:
        unit_s = statistics.median(seconds[(aug, threads)])
        wait_s = statistics.median(waits[(aug, threads)])
        pairs = zip(waits[(aug, threads)], seconds[(aug, threads)], strict=True)
        shares = [w / s for w, s in pairs]
        label = "crop 4 + flip" if aug else "none"
        print(
            f"| {label} | {threads} | {unit_s:.2f} | {wait_s:.3f} | "
            f"{100 * statistics.median(shares):.1f} % | {data.rows / unit_s:,.0f} |"
        )
    sys.stdout.flush()


# --- residency: bytes held against bytes stored ------------------------------------------


def stored_value_bytes(path: Path, column: str) -> int:
    """Bytes of a column's values in a partition file, uncompressed: a binary column's
    bytes end to end, an array column's values at their width (no offsets, no labels)."""
    array = pq.read_table(path, columns=[column]).column(column).combine_chunks()
    if pa.types.is_binary(array.type) or pa.types.is_large_binary(array.type):
        return int(pc.sum(pc.binary_length(array)).as_py())
    values = array.flatten()
    while pa.types.is_list(values.type) or pa.types.is_fixed_size_list(values.type):
        values = values.flatten()
    return len(values) * values.type.bit_width // 8


RSS_PROBE = """
import gc, sys
from cerebro_spark.data import read_manifest, read_partition
def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) * 1024
manifest = read_manifest(sys.argv[1])
warm = read_partition(sys.argv[1], "validation", 0, manifest=manifest)  # imports, pools
del warm
gc.collect()
before = rss()
data = read_partition(sys.argv[1], "train", 0, manifest=manifest)
gc.collect()
print(rss() - before)
"""


def fresh_rss_growth(dataset: Path) -> int:
    """RSS growth of a fresh Python process over reading train partition 0 (imports done)."""
    out = subprocess.run(
        [sys.executable, "-c", RSS_PROBE, str(dataset)], check=True, capture_output=True, text=True
    )
    return int(out.stdout.split()[-1])


def residency_table(args: argparse.Namespace, data_dir: Path) -> None:
    rows = args.residency_rows
    blobs, labels = photo_patches(rows, 32, seed=32)
    pixels = np.stack(
        [np.asarray(Image.open(io.BytesIO(b)).convert("RGB")).transpose(2, 0, 1) for b in blobs]
    )  # the same images, uint8 (rows, 3, 32, 32)
    flat = pa.FixedSizeListArray.from_arrays(pa.array(pixels.reshape(-1)), 3 * 32 * 32)
    cases = [
        (
            "uint8 array 3x32x32",
            pa.table({"pixels": flat, "label": labels}),
            "pixels",
            {"pixels": (3, 32, 32)},
            KindOptions(),
        ),
        (
            "JPEG image 32x32",
            pa.table({"image": pa.array(blobs, type=pa.binary()), "label": labels}),
            "image",
            None,
            KindOptions(image_columns=("image",)),
        ),
    ]
    print(
        f"residency: {rows} rows of 32x32 RGB photo patches (JPEG quality 90; the array "
        "column holds the same images decoded), 1 partition (80 % train); a worker holds a "
        "partition as read_partition returns it (issue target: uint8 images held <= 1.05x "
        "their stored bytes). stored: the column's values in the file, uncompressed (uint8 "
        "pixels, or the JPEG bytes end to end); file: the Parquet file (compressed); RSS and "
        "arrow: the RSS growth of a fresh process over the read (after "
        "it read the validation partition), and pyarrow's allocated bytes "
        "the read left in this one"
    )
    print(
        "| column | train rows | file bytes | stored bytes | held bytes | held / stored | "
        "held / file | RSS growth / held | arrow bytes / held | float32 pixels | "
        "held / float32 |"
    )
    print("|--|--:|--:|--:|--:|--:|--:|--:|--:|--:|--:|")
    for name, table, column, shapes, kinds in cases:
        store_dir = data_dir / f"residency-{column}"
        shutil.rmtree(store_dir, ignore_errors=True)
        manifest = prepare_dataset(
            table, str(store_dir), features=[column], label="label", num_partitions=1, seed=0,
            task="classification", feature_shapes=shapes, kinds=kinds,
        )  # fmt: skip
        dataset = store_dir / "datasets" / manifest.dataset_id
        part = manifest.partition("train", 0)
        stored = stored_value_bytes(dataset / part.path, column)
        gc.collect()
        arrow_before = pa.total_allocated_bytes()
        data = read_held_partition(str(dataset), "train", 0, manifest=manifest)
        gc.collect()
        arrow_growth = pa.total_allocated_bytes() - arrow_before
        growth = fresh_rss_growth(dataset)
        held = data.columns[0].nbytes
        float32 = data.rows * 3 * 32 * 32 * 4
        print(
            f"| {name} | {data.rows:,} | {part.bytes:,} | {stored:,} | {held:,} | "
            f"{held / stored:.3f}x | {held / part.bytes:.2f}x | {growth / held:.2f}x | "
            f"{arrow_growth / held:.2f}x | {float32:,} | {held / float32:.3f}x |"
        )
        del data
    print("(held: the feature column's PartitionData bytes, offsets included; labels apart)")
    sys.stdout.flush()


# --- criteo: categorical prepare and training throughput ----------------------------------

CRITEO_NUMBERS = 13
CRITEO_CATEGORIES = 26


def zipf_ids(rng: np.random.Generator, rows: int, cardinality: int, exponent: float) -> np.ndarray:
    """``rows`` ids in ``[0, cardinality)`` with frequency of rank k proportional to
    1 / (k + 1) ** exponent (id = rank)."""
    weights = 1.0 / np.arange(1, cardinality + 1, dtype=np.float64) ** exponent
    cdf = np.cumsum(weights)
    cdf /= cdf[-1]
    return np.searchsorted(cdf, rng.random(rows), side="right").astype(np.int32)


def criteo_tables(rows: int, seed: int) -> tuple[pa.Table, pa.Table, list[int]]:
    """The Criteo-like table (strings) and its dense twin (ranks as float32), cardinalities."""
    rng = np.random.default_rng(seed)
    cardinalities = [int(c) for c in np.geomspace(10, 1_000_000, CRITEO_CATEGORIES).round()]
    numbers = np.log1p(rng.lognormal(1.0, 1.5, size=(rows, CRITEO_NUMBERS))).astype(np.float32)
    logit = 0.8 * numbers[:, 0] - 0.6 * numbers[:, 1] + 0.4 * numbers[:, 2] - 1.0
    strings: dict[str, pa.Array] = {}
    dense: dict[str, Any] = {f"i{j}": numbers[:, j] for j in range(CRITEO_NUMBERS)}
    for j, cardinality in enumerate(cardinalities):
        ids = zipf_ids(rng, rows, cardinality, exponent=1.1)
        if j < 3:  # the label depends on the first three categories, value by value
            effect = rng.normal(0.0, 1.0, size=cardinality).astype(np.float32)
            logit += effect[ids]
        names = pc.binary_join_element_wise(
            f"c{j}_", pa.array(rng.permutation(cardinality).astype(np.int64)).cast(pa.string()), ""
        )  # value names unrelated to their frequency rank
        strings[f"c{j}"] = names.take(pa.array(ids))
        dense[f"c{j}"] = ids.astype(np.float32)
    labels = (rng.random(rows) < 1.0 / (1.0 + np.exp(-logit))).astype(np.int64)
    numeric = {f"i{j}": pa.array(numbers[:, j]) for j in range(CRITEO_NUMBERS)}
    table = pa.table({**numeric, **strings, "label": labels})
    twin = pa.table({**{k: pa.array(v) for k, v in dense.items()}, "label": labels})
    return table, twin, cardinalities


def criteo_table(args: argparse.Namespace, data_dir: Path) -> None:
    rows = args.criteo_rows
    partitions = args.criteo_partitions
    started = time.perf_counter()
    table, twin, cardinalities = criteo_tables(rows, seed=2025)
    made = time.perf_counter() - started
    positives = float(np.mean(table["label"].to_numpy()))
    numbers = [f"i{j}" for j in range(CRITEO_NUMBERS)]
    categories = [f"c{j}" for j in range(CRITEO_CATEGORIES)]
    kinds = KindOptions(
        categorical=tuple(categories), vocabulary_limit=100_000, hash_buckets=args.hash_buckets
    )
    print(
        f"criteo-like: {rows:,} rows ({CRITEO_NUMBERS} float32 numbers, {CRITEO_CATEGORIES} "
        f"string categories of cardinality {cardinalities[0]} .. {cardinalities[-1]:,} "
        f"(geometric), Zipf 1.1 frequencies; positives {positives:.3f}), "
        f"generated in {made:.1f} s; {partitions} partitions, 80 % train"
    )
    print(f"cardinalities: {cardinalities}")
    store_dir = data_dir / "criteo-store"
    shutil.rmtree(store_dir, ignore_errors=True)
    shutil.rmtree(data_dir / "criteo-checkpoints", ignore_errors=True)
    prepared: dict[str, Any] = {}
    print("prepare (plain writer, prepare_dataset, one process):")
    print("| input | rows | seconds | rows/s | peak RSS growth | input table bytes |")
    print("|--|--:|--:|--:|--:|--:|")
    for name, data, opts in (
        ("strings, KindOptions(categorical=26, vocabulary_limit=100_000, "
         f"hash_buckets={args.hash_buckets})", table, kinds),
        ("dense float32 twin", twin, KindOptions()),
    ):  # fmt: skip
        with PeakRss() as peak:
            start = time.perf_counter()
            manifest = prepare_dataset(
                data, str(store_dir), features=numbers + categories, label="label",
                num_partitions=partitions, seed=0, task="classification", kinds=opts,
            )  # fmt: skip
            seconds = time.perf_counter() - start
        prepared[name] = manifest
        print(
            f"| {name} | {rows:,} | {seconds:.1f} | {rows / seconds:,.0f} | "
            f"{peak.growth / 2**20:,.0f} MiB | {data.nbytes / 2**20:,.0f} MiB |"
        )
        sys.stdout.flush()
    del table, twin
    gc.collect()
    manifest_cat, manifest_dense = prepared.values()
    vocab = [c.cardinality for c in manifest_cat.info.columns_of("categorical")]
    print(f"ids per categorical column (vocabulary + hash buckets + unknown): {vocab}")
    hidden = [int(h) for h in args.hidden.split(",")]
    store = open_store(str(data_dir / "criteo-checkpoints"))
    runs = [
        ("EmbeddingMLPSpec", "cerebro_spark.training:EmbeddingMLPSpec", manifest_cat),
        ("MLPSpec (dense twin)", "cerebro_spark.training:MLPSpec", manifest_dense),
    ]
    held = {}
    for name, _, manifest in runs:
        dataset = store_dir / "datasets" / manifest.dataset_id
        held[name] = read_held_partition(str(dataset), "train", 0, manifest=manifest)
    params = {"hidden_units": hidden, "batch_size": args.criteo_batch, "lr": 0.001}
    times: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    keys: dict[str, str | None] = {name: None for name, _, _ in runs}
    waits: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    ios: dict[str, list[float]] = {name: [] for name, _, _ in runs}
    for step in range(args.repeats + 1):  # the first unit is a warm-up
        for name, spec, manifest in runs:
            task = dataclasses.replace(
                train_task(spec, params, step, keys[name]),
                checkpoint_out=f"{name.split()[0]}/{step}.pt",
            )
            result = run_unit(task, held[name], store, manifest.info)
            keys[name] = task.checkpoint_out
            if step:
                times[name].append(result.seconds)
                waits[name].append(result.data_wait_seconds)
                ios[name].append(result.io_seconds)
    print(
        "(checkpoint s: the unit's io_seconds, encoding the checkpoint of model and Adam "
        "state; rows/s (pass): rows over the unit's seconds less those)"
    )
    print(
        f"training: one train unit on train partition 0 ({held[runs[0][0]].rows:,} rows), "
        f"hidden_units {hidden}, batch_size {args.criteo_batch}, Adam lr 1e-3, torch at 1 "
        f"intra-op thread; median of {args.repeats} units after a warm-up unit"
    )
    print(
        "| model | input | params | optimizer | unit s | checkpoint s | rows/s (unit) "
        "| rows/s (pass) | data wait share | held bytes |"
    )
    print("|--|--|--:|--|--:|--:|--:|--:|--:|--:|")
    for name, spec, manifest in runs:
        data = held[name]
        model = load_spec(spec).build_model(params, manifest.info)
        count = sum(p.numel() for p in model.parameters())
        optimizer = type(load_spec(spec).build_optimizer(model, params)).__name__
        unit_s = statistics.median(times[name])
        io_s = statistics.median(ios[name])
        share = statistics.median(w / s for w, s in zip(waits[name], times[name], strict=True))
        kind = "13 numbers + 26 ids" if "Embedding" in name else "39 float32"
        print(
            f"| {name} | {kind} | {count:,} | {optimizer} | {unit_s:.2f} | {io_s:.2f} | "
            f"{data.rows / unit_s:,.0f} | {data.rows / (unit_s - io_s):,.0f} | "
            f"{100 * share:.1f} % | {data.nbytes / 2**20:,.1f} MiB |"
        )
    sys.stdout.flush()


TABLES: dict[str, Callable[[argparse.Namespace, Path], None]] = {
    "decode": decode_table,
    "unit": unit_table,
    "residency": residency_table,
    "criteo": criteo_table,
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tables", default="decode", help=f"comma-separated: {', '.join(TABLES)}")
    parser.add_argument("--rows", type=int, default=2000, help="images per size (default 2000)")
    parser.add_argument("--sizes", default="32,112", help="image sizes in px (default 32,112)")
    parser.add_argument("--threads", default="1,2", help="T: threads / workers (default 1,2)")
    parser.add_argument("--epochs", type=int, default=5, help="timed epochs (default 5)")
    parser.add_argument("--data-dir", help="where the Parquet files go (default: a temp dir)")
    parser.add_argument("--unit-rows", type=int, default=640, help="unit: train rows")
    parser.add_argument("--width", type=float, default=0.25, help="unit: ResNet width")
    parser.add_argument("--repeats", type=int, default=3, help="unit, criteo: timed units")
    parser.add_argument("--residency-rows", type=int, default=20000, help="residency: rows")
    parser.add_argument("--criteo-rows", type=int, default=2_000_000, help="criteo: rows")
    parser.add_argument("--criteo-partitions", type=int, default=8, help="criteo: partitions")
    parser.add_argument("--criteo-batch", type=int, default=1024, help="criteo: batch size")
    parser.add_argument("--hidden", default="256,128", help="criteo: hidden units")
    parser.add_argument("--hash-buckets", type=int, default=1000, help="criteo: hash buckets")
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
