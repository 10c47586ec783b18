"""Prepare-time encoders of the feature kinds ``image``, ``categorical`` and ``sequence``.

Both dataset writers turn their input columns into stored columns with these functions:
the plain-Python writer on whole columns or chunks, the Spark writer in ``mapInArrow``
tasks on Arrow record batches. Every function is a pure, deterministic function of its
arguments (no global state, no dict-order or hash-seed dependence, no clock), and each
row's output depends only on that row and the arguments, so processing a column at once
or in consecutive chunks gives the same bytes; the per-chunk facts and counts merge with
:func:`merge_facts`, :func:`merge_counts` and :func:`merge_sequence_facts`.

The stored form of each kind is described on :class:`~cerebro_spark.data.ColumnInfo`:

* ``image``: :func:`image_column` keeps each JPEG or PNG byte for byte when it already has
  the column's size and channel mode, and otherwise decodes, converts, resizes and
  re-encodes it in its own encoding with fixed settings (:data:`JPEG_OPTIONS`,
  :data:`PNG_OPTIONS`). Re-encoded bytes are deterministic for one build of Pillow (its
  libjpeg-turbo and zlib): a cluster whose executors run another Pillow build than the
  driver may produce other (equally valid) bytes for the re-encoded images.
* ``categorical``: :func:`encode_categories` maps values to ``int32`` ids through the
  vocabulary of :func:`build_vocabulary` and, beyond it, :func:`category_hash`.
* ``sequence``: :func:`sequence_column` stores ``list<int32>`` token ids, each row cut to
  ``max_length``.

:func:`infer_kind` and :func:`looks_ragged` infer a column's kind from its Arrow type (and
a sample of its values) when the user did not name it.
"""

from __future__ import annotations

import dataclasses
import io
import logging
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from PIL import Image

from cerebro_spark.data import _validate as v
from cerebro_spark.data._format import UNKNOWN_ID
from cerebro_spark.data._vectors import is_vector_type
from cerebro_spark.errors import DataError

logger = logging.getLogger(__name__)

# -- images -----------------------------------------------------------------------------------

_JPEG_MAGIC = b"\xff\xd8\xff"
_PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
#: Pillow's format name of each encoding.
_PIL_FORMAT = {"jpeg": "JPEG", "png": "PNG"}
#: Settings of every JPEG this module encodes (baseline, no chroma subsampling).
JPEG_OPTIONS: Mapping[str, Any] = {
    "quality": 95,
    "subsampling": 0,
    "optimize": False,
    "progressive": False,
}
#: Settings of every PNG this module encodes.
PNG_OPTIONS: Mapping[str, Any] = {"compress_level": 6, "optimize": False}
#: Fields of the struct Spark's image data source (``spark.read.format("image")``) reads.
SPARK_IMAGE_FIELDS = ("origin", "height", "width", "nChannels", "mode", "data")
#: OpenCV type of a Spark image row (its ``mode``) -> channels of its pixel bytes.
_SPARK_MODES = {0: 1, 16: 3, 24: 4}
#: Pillow modes read as grayscale (one channel): 1-bit, 8-bit, 8-bit with alpha (the alpha
#: is dropped) and 16-bit (the high byte of each pixel is kept).
_GRAY_MODES = frozenset({"1", "L", "LA", "La", "I", "I;16", "I;16L", "I;16B", "I;16N"})
#: The most bytes one binary array holds (32-bit offsets).
_MAX_BINARY_BYTES = 2**31 - 1


def image_encoding(data: bytes) -> str | None:
    """The encoding of an image by its magic bytes.

    Args:
        data: The encoded image.

    Returns:
        ``"jpeg"`` (starts with ``FF D8 FF``), ``"png"`` (the 8-byte PNG signature), else
        ``None``.
    """
    if data.startswith(_JPEG_MAGIC):
        return "jpeg"
    if data.startswith(_PNG_MAGIC):
        return "png"
    return None


def is_spark_image_struct(arrow_type: pa.DataType) -> bool:
    """Whether ``arrow_type`` is the struct of Spark's image data source.

    That struct has the fields ``origin`` (string), ``height``, ``width``, ``nChannels``,
    ``mode`` (integers) and ``data`` (binary: the raw pixels, BGR(A) order).
    """
    if not pa.types.is_struct(arrow_type):
        return False
    fields = {
        arrow_type.field(i).name: arrow_type.field(i).type for i in range(arrow_type.num_fields)
    }
    if set(fields) != set(SPARK_IMAGE_FIELDS):
        return False
    return bool(
        (pa.types.is_string(fields["origin"]) or pa.types.is_large_string(fields["origin"]))
        and all(pa.types.is_integer(fields[f]) for f in ("height", "width", "nChannels", "mode"))
        and (pa.types.is_binary(fields["data"]) or pa.types.is_large_binary(fields["data"]))
    )


def _is_binary(arrow_type: pa.DataType) -> bool:
    return bool(pa.types.is_binary(arrow_type) or pa.types.is_large_binary(arrow_type))


def _chunks(array: pa.Array | pa.ChunkedArray) -> Iterator[pa.Array]:
    if isinstance(array, pa.ChunkedArray):
        yield from array.chunks
    else:
        yield array


def is_image_column(array: pa.Array | pa.ChunkedArray, sample: int = 16) -> bool:
    """Whether a column holds images (used to infer the ``image`` kind).

    Args:
        array: The column (or a sample of it).
        sample: How many of its first non-null values to look at.

    Returns:
        ``True`` for Spark's image struct (:func:`is_spark_image_struct`) and for a
        ``binary``/``large_binary`` column whose first ``sample`` non-null values all start
        with JPEG or PNG magic bytes; ``False`` otherwise, and for a column without a
        non-null value.
    """
    if is_spark_image_struct(array.type):
        return True
    if not _is_binary(array.type):
        return False
    seen = 0
    for chunk in _chunks(array):
        for value in chunk:
            if seen >= sample:
                return True
            if value.is_valid:
                if image_encoding(value.as_py()) is None:
                    return False
                seen += 1
    return seen > 0


@dataclasses.dataclass(frozen=True)
class ImageFacts:
    """What :func:`image_column` learned about an image column (or a chunk of it).

    Attributes:
        encoding: ``"jpeg"`` or ``"png"`` when every stored image has that encoding, else
            ``"mixed"``; ``""`` when there were no rows.
        shape: The decoded ``(channels, height, width)`` of every image; ``(0, 0, 0)`` when
            there were no rows.
        first_row: The row of the first image (where its shape was first seen), for error
            messages when chunks are merged.
    """

    encoding: str
    shape: tuple[int, int, int]
    first_row: int = 0

    @property
    def empty(self) -> bool:
        """Whether these are the facts of no rows (neutral in :func:`merge_facts`)."""
        return self.encoding == ""


def _hw(shape: Sequence[int]) -> str:
    return f"{shape[-2]}x{shape[-1]}"


def _size_mismatch(
    name: str, first: tuple[int, int, int], first_row: int, other: Sequence[int], row: int
) -> DataError:
    return DataError(
        f"image column {name!r} holds images of different sizes (height x width): "
        f"{_hw(first)} first seen at row {first_row} and {_hw(other)} first seen at row {row}; "
        "every image must have one size: pass --image-size H W to resize them "
        "(image_size in a config or in Tuner.fit(kinds=...))"
    )


def merge_facts(name: str, a: ImageFacts, b: ImageFacts) -> ImageFacts:
    """Merge the facts of two consecutive chunks of one image column.

    The result is what :func:`image_column` gives for both chunks at once: the sizes must
    agree; the channels are 3 if either chunk has 3 (a chunk of grayscale images processed
    with ``channels=None`` has 1); the encodings are ``"mixed"`` when they differ.

    Args:
        name: The column, for messages.
        a: Facts of the earlier chunk.
        b: Facts of the later chunk.

    Raises:
        DataError: The chunks' images have different sizes.
    """
    if a.empty:
        return b
    if b.empty:
        return a
    if a.shape[1:] != b.shape[1:]:
        raise _size_mismatch(name, a.shape, a.first_row, b.shape, b.first_row)
    encoding = a.encoding if a.encoding == b.encoding else "mixed"
    channels = max(a.shape[0], b.shape[0])
    return ImageFacts(encoding, (channels, a.shape[1], a.shape[2]), a.first_row)


def _check_size(size: object) -> tuple[int, int] | None:
    if size is None:
        return None
    if (
        not isinstance(size, (tuple, list))
        or len(size) != 2
        or any(isinstance(d, bool) or not isinstance(d, int) or d < 1 for d in size)
    ):
        raise DataError(f"image size must be two integers (height, width) >= 1, got {size!r}")
    return int(size[0]), int(size[1])


def _check_channels(channels: object) -> int | None:
    if channels is None:
        return None
    if isinstance(channels, bool) or not isinstance(channels, int) or channels not in (1, 3):
        raise DataError(f"image channels must be 1 (grayscale) or 3 (RGB), got {channels!r}")
    return channels


def _open(data: bytes) -> tuple[Image.Image, str]:
    """Open and fully decode JPEG or PNG bytes; raise ``ValueError`` saying why not."""
    encoding = image_encoding(data)
    if encoding is None:
        raise ValueError(f"is not a JPEG or PNG image (it starts with bytes {data[:8].hex(' ')!r})")
    try:
        image = Image.open(io.BytesIO(data), formats=[_PIL_FORMAT[encoding]])
        image.load()
    except (OSError, SyntaxError, ValueError, EOFError, Image.DecompressionBombError) as exc:
        raise ValueError(f"is a {encoding.upper()} that does not decode: {exc}") from exc
    return image, encoding


def _to_mode(image: Image.Image, mode: str) -> Image.Image:
    """Convert a decoded image to ``"L"`` or ``"RGB"`` (the image itself if it is one).

    Grayscale modes become ``L`` first (16-bit: the high byte of each pixel; alpha
    dropped), colour modes ``RGB`` (alpha dropped, not composited; palette and CMYK by
    Pillow's conversion); then ``L`` <-> ``RGB`` by Pillow (replication, ITU-R 601-2 luma).
    """
    if image.mode == mode:
        return image
    if image.mode.startswith("I"):
        pixels = np.asarray(image).astype(np.int64) >> 8
        image = Image.fromarray(np.clip(pixels, 0, 255).astype(np.uint8), mode="L")
    elif image.mode == "F":
        raise ValueError(
            "has 32-bit floating-point pixels (mode F); images must have 8 or 16-bit channels"
        )
    elif image.mode not in ("L", "RGB"):
        image = image.convert("L" if image.mode in _GRAY_MODES else "RGB")
    return image if image.mode == mode else image.convert(mode)


def _encode(image: Image.Image, encoding: str) -> bytes:
    """Encode with the module's fixed settings and no metadata (EXIF, ICC, text, DPI)."""
    image.info = {}
    out = io.BytesIO()
    options = JPEG_OPTIONS if encoding == "jpeg" else PNG_OPTIONS
    image.save(out, format=_PIL_FORMAT[encoding], **options)
    return out.getvalue()


def _spark_image(row: Mapping[str, Any]) -> Image.Image:
    """A Spark image-source row (raw BGR(A) pixels) as an ``L`` or ``RGB`` image."""
    fields: list[Any] = [row.get(f) for f in ("height", "width", "nChannels", "mode", "data")]
    if None in fields or fields[3] == -1 or fields[0] < 1 or fields[1] < 1:
        raise ValueError(
            f"is an image Spark could not read (height {fields[0]}, width {fields[1]}, "
            f"mode {fields[3]}, {len(fields[4] or b'')} bytes of data); drop such rows "
            "(the image source's dropInvalid option)"
        )
    height, width, n_channels, mode = (int(f) for f in fields[:4])
    data: bytes = fields[4]
    if _SPARK_MODES.get(mode) != n_channels:
        raise ValueError(
            f"has mode {mode} with nChannels {n_channels}; Spark images must be OpenCV type "
            "0 (CV_8UC1, 1 channel), 16 (CV_8UC3, 3 channels) or 24 (CV_8UC4, 4 channels)"
        )
    if len(data) != height * width * n_channels:
        raise ValueError(
            f"has {len(data)} bytes of pixel data; {height} x {width} x {n_channels} "
            f"channels needs {height * width * n_channels}"
        )
    pixels = np.frombuffer(data, dtype=np.uint8).reshape(height, width, n_channels)
    if n_channels == 1:
        return Image.fromarray(np.ascontiguousarray(pixels[:, :, 0]), mode="L")
    rgb = np.ascontiguousarray(pixels[:, :, 2::-1])  # BGR(A) -> RGB, alpha dropped
    return Image.fromarray(rgb, mode="RGB")


def _image_rows(name: str, array: pa.Array | pa.ChunkedArray) -> tuple[Iterator[Any], bool]:
    """The rows as Python values, one at a time (a chunk's bytes are not copied at once)."""
    if is_spark_image_struct(array.type) or _is_binary(array.type):
        values = (value.as_py() for chunk in _chunks(array) for value in chunk)
        return values, is_spark_image_struct(array.type)
    raise DataError(
        f"image column {name!r} has type {array.type}; images must be a binary column of "
        "JPEG or PNG bytes (e.g. the content column of Spark's binaryFile source) or the "
        "struct of Spark's image source"
    )


def image_column(
    name: str,
    array: pa.Array | pa.ChunkedArray,
    *,
    size: tuple[int, int] | None = None,
    channels: int | None = None,
    first_row: int = 0,
) -> tuple[pa.Array, ImageFacts]:
    """Turn an input image column into the stored column: one encoded image per row.

    Input: a binary column of JPEG or PNG bytes, or Spark's image struct (raw pixels in
    BGR(A) order, OpenCV type 0, 16 or 24), whose rows are encoded losslessly as PNG in
    RGB order (alpha dropped).

    Each image is decoded in full (a truncated or corrupt image is refused), converted to
    the column's channel mode, resized, and re-encoded in its own encoding
    (:data:`JPEG_OPTIONS`, :data:`PNG_OPTIONS`, no metadata) if converting or resizing
    changed it; an image already of the column's size and mode is kept byte for byte.
    EXIF orientation is never applied (readers ignore it too).

    * Channels: ``channels=1`` converts every image to grayscale (Pillow ``L``), ``3`` to
      RGB. ``None`` keeps grayscale images (modes ``1``, ``L``, ``LA``, 16-bit: they become
      ``L``) as one channel and turns every other mode (``RGBA``, ``P``, ``CMYK`` ...) into
      ``RGB``; the column has 1 channel if every image is grayscale, else 3, and its
      grayscale images are then decoded as RGB (:func:`decode_image` converts). Alpha is
      dropped, not composited; 16-bit pixels keep their high byte.
    * Size: ``size=(H, W)`` resizes every image of another size (bilinear). Without it,
      every image must have the size of the first.

    Each row's output depends only on that row and the arguments, so consecutive chunks
    give the rows of the whole; merge their facts with :func:`merge_facts`.

    Args:
        name: The column, for messages.
        array: The input column.
        size: ``(height, width)`` of every stored image, or ``None`` to require one size.
        channels: 1, 3, or ``None`` (by the images).
        first_row: The row number of ``array[0]`` in the whole column (for messages).

    Returns:
        The stored column (``binary``) and its facts.

    Raises:
        DataError: The column's type, a null, a value that is no JPEG or PNG or does not
            decode (naming the row), or images of several sizes without ``size``; a bad
            ``size`` or ``channels``.
    """
    target_size = _check_size(size)
    target_channels = _check_channels(channels)
    rows, spark = _image_rows(name, array)
    outputs: list[bytes] = []
    encodings: set[str] = set()
    color = False
    first: tuple[int, int] | None = None
    for i, value in enumerate(rows):
        row = first_row + i
        where = f"image column {name!r} row {row}"
        if value is None:
            raise DataError(f"{where} is null; every row needs an image (drop or fill the row)")
        try:
            if spark:
                where += f" (origin {value.get('origin')!r})"
                image, encoding, data = _spark_image(value), "png", None
            else:
                data = value
                image, encoding = _open(data)
            gray = image.mode in _GRAY_MODES
            if target_channels is None:
                mode = "L" if gray else "RGB"
            else:
                mode = "L" if target_channels == 1 else "RGB"
            out = _to_mode(image, mode)
        except ValueError as exc:
            raise DataError(f"{where} {exc}") from exc
        color = color or mode == "RGB"
        height_width = (out.height, out.width)
        if target_size is None:
            if first is None:
                first = height_width
            elif height_width != first:
                raise _size_mismatch(name, (0, *first), first_row, (0, *height_width), row)
        elif height_width != target_size:
            out = out.resize((target_size[1], target_size[0]), Image.Resampling.BILINEAR)
        if data is None or out is not image:
            data = _encode(out, encoding)
        outputs.append(data)
        encodings.add(encoding)
    if not outputs:
        return pa.array([], type=pa.binary()), ImageFacts("", (0, 0, 0), first_row)
    total = sum(len(data) for data in outputs)
    if total > _MAX_BINARY_BYTES:
        raise DataError(
            f"image column {name!r}: rows {first_row}..{first_row + len(outputs) - 1} hold "
            f"{total} bytes of images, more than one binary array holds ({_MAX_BINARY_BYTES}); "
            "process the column in smaller chunks"
        )
    if target_size is None:
        assert first is not None  # set by the first row
        target_size = first
    height, width = target_size
    c = target_channels if target_channels is not None else (3 if color else 1)
    encoding = encodings.pop() if len(encodings) == 1 else "mixed"
    return pa.array(outputs, type=pa.binary()), ImageFacts(encoding, (c, height, width), first_row)


def decode_image(data: bytes, shape: Sequence[int]) -> np.ndarray:
    """Decode one stored image to ``uint8`` pixels of the column's shape.

    Args:
        data: JPEG or PNG bytes.
        shape: The column's ``(channels, height, width)``; the image is converted to 1
            channel (``L``) or 3 (``RGB``) as :func:`image_column` converts.

    Returns:
        A C-contiguous ``uint8`` array of shape ``(C, H, W)``.

    Raises:
        DataError: The bytes do not decode, or the image has another size.
    """
    channels, height, width = (int(d) for d in shape)
    if channels not in (1, 3):
        raise DataError(f"image shape {tuple(shape)} must have 1 or 3 channels")
    try:
        image, _ = _open(data)
        image = _to_mode(image, "L" if channels == 1 else "RGB")
    except ValueError as exc:
        raise DataError(f"stored image {exc}") from exc
    if (image.height, image.width) != (height, width):
        raise DataError(
            f"stored image is {image.height}x{image.width} (height x width); the column's "
            f"images are {height}x{width}"
        )
    pixels = np.asarray(image, dtype=np.uint8)
    if channels == 1:
        return np.ascontiguousarray(pixels.reshape(1, height, width))
    return np.ascontiguousarray(pixels.transpose(2, 0, 1))


def image_moments(array: pa.Array | pa.ChunkedArray, shape: Sequence[int]) -> np.ndarray:
    """Per-channel moments of the stored images' pixels, scaled to [0, 1].

    Pixel sums are exact integers over the whole array (Python ints), divided once, so
    the result depends only on the pixels (not on their order within the array).

    Args:
        array: A stored image column (or a partition of it).
        shape: The column's ``(C, H, W)``.

    Returns:
        ``float64`` ``(C, 3)``: per channel the pixel count, the sum of pixel values / 255
        and the sum of their squares / 255².
    """
    channels = int(shape[0])
    sums = [0] * channels
    squares = [0] * channels
    count = 0
    for chunk in _chunks(array):
        for value in chunk:
            data = value.as_py()
            if data is None:
                raise DataError("stored image column holds a null")
            pixels = decode_image(data, shape).reshape(channels, -1).astype(np.int64)
            count += pixels.shape[1]
            for c in range(channels):
                sums[c] += int(pixels[c].sum())
                squares[c] += int(np.dot(pixels[c], pixels[c]))
    moments = np.empty((channels, 3), dtype=np.float64)
    for c in range(channels):
        moments[c] = (float(count), sums[c] / 255, squares[c] / 255**2)
    return moments


def image_statistics(moments: Sequence[np.ndarray]) -> dict[str, list[float]]:
    """Per-channel mean and population std from partitions' :func:`image_moments`.

    The moments are summed in the given order (partition order), in ``float64``.

    Returns:
        ``{"mean": [...], "std": [...]}``, one plain float per channel.

    Raises:
        DataError: No moments, moments of different shapes, or no pixels.
    """
    if not moments:
        raise DataError("image statistics need the moments of at least one partition")
    total = np.zeros_like(np.asarray(moments[0], dtype=np.float64))
    for part in moments:
        part = np.asarray(part, dtype=np.float64)
        if part.shape != total.shape or part.ndim != 2 or part.shape[1] != 3:
            raise DataError(
                f"image moments of shape {part.shape} and {total.shape} cannot be combined; "
                "each must be (channels, 3)"
            )
        total = total + part
    count = total[:, 0]
    if np.any(count <= 0):
        raise DataError("image statistics need at least one pixel per channel, got none")
    mean = total[:, 1] / count
    variance = np.maximum(total[:, 2] / count - mean * mean, 0.0)
    return {"mean": [float(m) for m in mean], "std": [float(s) for s in np.sqrt(variance)]}


# -- categories -------------------------------------------------------------------------------

#: Ids are ``int32``: the largest number of ids a categorical column may have.
MAX_CARDINALITY = 2**31 - 1


def category_values(name: str, array: pa.Array | pa.ChunkedArray) -> pa.Array:
    """Check a categorical column and return its values as ``string`` or ``int64``.

    Strings (``string``, ``large_string``) become ``string``; integers of any width and
    booleans (as 0 and 1) become ``int64``; dictionary-encoded columns are decoded first.

    Raises:
        DataError: Another type, nulls (with their count), or ``uint64`` values beyond
            ``int64``.
    """
    array = v.as_array(array)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    kind = array.type
    if pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_string_view(kind):
        target = pa.string()
    elif pa.types.is_integer(kind) or pa.types.is_boolean(kind):
        target = pa.int64()
    else:
        raise DataError(
            f"categorical column {name!r} has type {kind}; categories must be strings, "
            "integers or booleans"
        )
    if array.null_count:
        raise DataError(
            f"categorical column {name!r} has {array.null_count} null values of {len(array)} "
            "rows; nulls are not allowed: fill them with a value of their own (e.g. 'missing')"
        )
    try:
        return array.cast(target)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise DataError(
            f"categorical column {name!r} of type {kind} does not fit {target}: {exc}"
        ) from exc


def count_categories(values: pa.Array | pa.ChunkedArray) -> dict[Any, int]:
    """Count the rows of each value (of :func:`category_values`).

    Returns:
        Value -> rows, keys in ascending order; mergeable by :func:`merge_counts`.
    """
    counted = pc.value_counts(v.as_array(values))
    pairs = zip(
        counted.field("values").to_pylist(), counted.field("counts").to_pylist(), strict=True
    )
    return dict(sorted(pairs))


def merge_counts(a: Mapping[Any, int], b: Mapping[Any, int]) -> dict[Any, int]:
    """Add two value counts (of two chunks of one column); keys in ascending order."""
    merged = dict(a)
    for value, rows in b.items():
        merged[value] = merged.get(value, 0) + rows
    return dict(sorted(merged.items()))


def _check_count_parameter(name: str, what: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise DataError(
            f"categorical column {name!r}: {what} must be an integer >= {minimum}, got {value!r}"
        )
    return value


def _check_cardinality(name: str, vocabulary: int, hash_buckets: int) -> None:
    ids = 1 + vocabulary + hash_buckets
    if ids > MAX_CARDINALITY:
        raise DataError(
            f"categorical column {name!r} would have {ids} ids (1 unknown + {vocabulary} "
            f"vocabulary values + {hash_buckets} hash buckets); ids are int32, so at most "
            f"{MAX_CARDINALITY}: lower the vocabulary limit or the hash buckets"
        )


def build_vocabulary(
    name: str, counts: Mapping[Any, int], *, limit: int, hash_buckets: int
) -> tuple[tuple[Any, ...], int]:
    """Choose a categorical column's vocabulary from its value counts.

    The vocabulary is the ``limit`` most frequent values, by descending count then
    ascending value (all of them if there are at most ``limit``). The values beyond it
    share ``hash_buckets`` ids by :func:`category_hash`, or map to ``UNKNOWN_ID`` when
    ``hash_buckets`` is 0 (logged).

    Args:
        name: The column, for messages.
        counts: Value -> rows (:func:`count_categories`) over the train split.
        limit: Most values with an id of their own (>= 1).
        hash_buckets: Ids for the values beyond the vocabulary (>= 0).

    Returns:
        The vocabulary and the hash buckets used: ``hash_buckets``, or 0 when every value
        has its own id.

    Raises:
        DataError: ``limit < 1``, ``hash_buckets < 0``, or more ids than ``int32`` holds
            (``1 + len(vocabulary) + hash_buckets > 2**31 - 1``).
    """
    limit = _check_count_parameter(name, "the vocabulary limit", limit, 1)
    hash_buckets = _check_count_parameter(name, "hash_buckets", hash_buckets, 0)
    try:
        ranked = sorted(counts.items(), key=lambda item: (-item[1], item[0]))
    except TypeError as exc:
        kinds = sorted({type(value).__name__ for value in counts})
        raise DataError(
            f"categorical column {name!r} has values of several types ({', '.join(kinds)}); "
            "a column's categories must all be strings or all integers"
        ) from exc
    vocabulary = tuple(value for value, _ in ranked[:limit])
    _check_cardinality(name, len(vocabulary), hash_buckets)
    if len(ranked) <= limit:
        return vocabulary, 0
    rest_values = len(ranked) - limit
    rest_rows = sum(rows for _, rows in ranked[limit:])
    if hash_buckets:
        logger.info(
            "categorical column %r: %d values (%d rows) beyond the vocabulary of %d share "
            "%d hash buckets",
            name,
            rest_values,
            rest_rows,
            limit,
            hash_buckets,
        )
    else:
        logger.info(
            "categorical column %r: %d values (%d rows) beyond the vocabulary of %d map to "
            "the unknown id %d",
            name,
            rest_values,
            rest_rows,
            limit,
            UNKNOWN_ID,
        )
    return vocabulary, hash_buckets


_FNV_OFFSET = np.uint64(0xCBF29CE484222325)
_FNV_PRIME = np.uint64(0x100000001B3)
_MIX_1 = np.uint64(0xFF51AFD7ED558CCD)
_MIX_2 = np.uint64(0xC4CEB9FE1A85EC53)
_SHIFT = np.uint64(33)


#: Below this many rows still hashing, the rest of their bytes are hashed one row at a time
#: (a numpy step per byte position costs more than a few rows' bytes in Python).
_FEW_ROWS = 16
#: Rows hashed together: their bytes (consecutive in the Arrow buffer) stay in cache while
#: the block's loop over byte positions reads them.
_HASH_BLOCK = 16384


def _fnv1a(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """FNV-1a 64 of ``data[starts[i]:starts[i] + lengths[i]]`` for every ``i``, vectorised.

    Rows are hashed in blocks of :data:`_HASH_BLOCK`; within a block they are sorted by
    descending length, so the rows still hashing at byte position ``j`` are a prefix: one
    numpy step per position over those rows, and the tails of the last few long rows are
    finished in Python.
    """
    hashes = np.full(len(lengths), _FNV_OFFSET, dtype=np.uint64)
    for first in range(0, len(lengths), _HASH_BLOCK):
        block = slice(first, first + _HASH_BLOCK)
        hashes[block] = _fnv1a_block(data, starts[block], lengths[block])
    return hashes


def _fnv1a_block(data: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    hashes = np.full(len(lengths), _FNV_OFFSET, dtype=np.uint64)
    longest = int(lengths.max())
    # A stable sort by descending length; radix sort when the key fits 16 bits.
    key = longest - lengths
    order = np.argsort(key.astype(np.uint16) if longest < 2**16 else key, kind="stable")
    sorted_lengths = lengths[order]
    positions = starts[order].astype(np.int64)
    # active[j]: how many rows are longer than j.
    active = np.searchsorted(-sorted_lengths, -np.arange(longest), side="left")
    for j in range(longest):
        k = int(active[j])
        if k <= _FEW_ROWS:
            for r in range(k):
                tail = data[positions[r] + j : positions[r] + sorted_lengths[r]]
                hashes[r] = _fnv1a_bytes(int(hashes[r]), tail.tobytes())
            break
        head = hashes[:k]
        head ^= data[positions[:k] + j]
        head *= _FNV_PRIME
    out = np.empty_like(hashes)
    out[order] = hashes
    return out


def _fnv1a_bytes(state: int, data: bytes) -> int:
    """Continue an FNV-1a 64 hash from ``state`` over ``data`` (one row, in Python)."""
    prime = int(_FNV_PRIME)
    for byte in data:
        state = ((state ^ byte) * prime) & 0xFFFFFFFFFFFFFFFF
    return state


def _fmix64(hashes: np.ndarray) -> np.ndarray:
    """MurmurHash3's 64-bit finaliser (spreads every input bit over the low bits)."""
    h: np.ndarray = hashes ^ (hashes >> _SHIFT)
    h *= _MIX_1
    h ^= h >> _SHIFT
    h *= _MIX_2
    h ^= h >> _SHIFT
    return h


def category_hash(values: pa.Array | pa.ChunkedArray) -> np.ndarray:
    """A stable 64-bit hash of each categorical value.

    The hash is MurmurHash3's ``fmix64`` finaliser applied to the FNV-1a 64 hash of the
    value's bytes: a string's UTF-8 bytes, an integer's 8 bytes as ``int64`` little-endian.
    It depends on nothing but the value (no seed, no platform), and must never change: it
    decides the ids of the values beyond every stored vocabulary.

    Args:
        values: Strings or integers (as :func:`category_values` returns them; other integer
            and string types are cast).

    Returns:
        ``uint64``, one hash per value.
    """
    array = v.as_array(values)
    if pa.types.is_dictionary(array.type):
        array = array.dictionary_decode()
    if pa.types.is_integer(array.type) or pa.types.is_boolean(array.type):
        ints = np.ascontiguousarray(
            array.cast(pa.int64()).to_numpy(zero_copy_only=False), dtype="<i8"
        )
        data = ints.view(np.uint8)
        starts: np.ndarray = np.arange(len(ints), dtype=np.int64) * 8
        lengths: np.ndarray = np.full(len(ints), 8, dtype=np.int64)
    else:
        if not (pa.types.is_string(array.type) or pa.types.is_large_string(array.type)):
            array = array.cast(pa.large_string())
        if array.null_count:
            raise DataError(f"cannot hash {array.null_count} null categorical values")
        offset_type = np.int32 if pa.types.is_string(array.type) else np.int64
        offsets = np.frombuffer(array.buffers()[1], dtype=offset_type)
        offsets = offsets[array.offset : array.offset + len(array) + 1].astype(np.int64)
        buffer = array.buffers()[2]
        data = (
            np.frombuffer(buffer, dtype=np.uint8) if buffer is not None else np.empty(0, np.uint8)
        )
        starts = offsets[:-1]
        lengths = np.diff(offsets)
    return _fmix64(_fnv1a(data, starts, lengths))


def encode_categories(
    name: str,
    values: pa.Array | pa.ChunkedArray,
    vocabulary: Sequence[Any],
    hash_buckets: int,
) -> pa.Int32Array:
    """Map categorical values to their ``int32`` ids (prepare time and scoring).

    ``vocabulary[k]`` gets id ``1 + k``; any other value gets ``1 + len(vocabulary) +
    category_hash(value) % hash_buckets`` when ``hash_buckets > 0``, else ``UNKNOWN_ID``.

    Args:
        name: The column, for messages.
        values: The column (checked and converted by :func:`category_values`).
        vocabulary: The column's vocabulary (:func:`build_vocabulary`).
        hash_buckets: The hash buckets it uses.

    Raises:
        DataError: The column's type or nulls; a vocabulary of another type than the values
            or with a value twice; more ids than ``int32`` holds.
    """
    hash_buckets = _check_count_parameter(name, "hash_buckets", hash_buckets, 0)
    _check_cardinality(name, len(vocabulary), hash_buckets)
    values = category_values(name, values)
    try:
        value_set = pa.array(list(vocabulary), type=values.type)
    except (pa.ArrowInvalid, pa.ArrowTypeError, TypeError, OverflowError) as exc:
        raise DataError(
            f"categorical column {name!r} holds {values.type} values, but its vocabulary "
            f"does not: {exc}"
        ) from exc
    if len(pc.unique(value_set)) != len(value_set):
        raise DataError(f"the vocabulary of categorical column {name!r} holds a value twice")
    index = pc.index_in(values, value_set=value_set)
    ids = index.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64) + 1
    if hash_buckets:
        outside = np.flatnonzero(ids == 0)
        if len(outside):
            hashes = category_hash(values.take(pa.array(outside)))
            ids[outside] = 1 + len(vocabulary) + (hashes % np.uint64(hash_buckets)).astype(np.int64)
    result: pa.Int32Array = pa.array(ids.astype(np.int32), type=pa.int32())
    return result


def category_statistics(
    counts: Mapping[Any, int], vocabulary: Sequence[Any], hash_buckets: int
) -> dict[str, int]:
    """Statistics of a categorical column's train rows.

    Args:
        counts: Value -> rows over the train split.
        vocabulary: The column's vocabulary.
        hash_buckets: The hash buckets it uses (as :func:`build_vocabulary` returned them).

    Returns:
        ``rows``, ``distinct`` values, ``unknown`` (rows mapped to ``UNKNOWN_ID``) and
        ``hashed`` (rows mapped to hash buckets).
    """
    rows = sum(counts.values())
    known = sum(counts.get(value, 0) for value in vocabulary)
    rest = rows - known
    return {
        "rows": rows,
        "distinct": len(counts),
        "unknown": 0 if hash_buckets else rest,
        "hashed": rest if hash_buckets else 0,
    }


# -- sequences --------------------------------------------------------------------------------

#: Token ids are ``int32``: every id must be below this.
_ID_LIMIT = 2**31


@dataclasses.dataclass(frozen=True)
class SequenceFacts:
    """What :func:`sequence_column` learned about a sequence column (or a chunk of it).

    Lengths are those of the stored sequences (after cutting to ``max_length``);
    ``truncated`` counts the rows that were cut. ``max_id`` is over every input id (the cut
    ones too), so the column's cardinality (``max_id + 1``) does not depend on
    ``max_length``. For no rows: ``min_length`` and ``max_id`` are -1, the others 0.

    Attributes:
        min_length: Shortest stored sequence.
        max_length: Longest stored sequence.
        total_length: Sum of the lengths (with the rows, the mean).
        truncated: Rows longer than ``max_length`` (cut).
        max_id: Largest token id, -1 if there are none.
    """

    min_length: int
    max_length: int
    total_length: int
    truncated: int
    max_id: int


#: The facts of no rows (neutral in :func:`merge_sequence_facts`).
NO_SEQUENCES = SequenceFacts(min_length=-1, max_length=0, total_length=0, truncated=0, max_id=-1)


def merge_sequence_facts(a: SequenceFacts, b: SequenceFacts) -> SequenceFacts:
    """Merge the facts of two chunks of one sequence column."""
    if a.min_length < 0:
        return b
    if b.min_length < 0:
        return a
    return SequenceFacts(
        min_length=min(a.min_length, b.min_length),
        max_length=max(a.max_length, b.max_length),
        total_length=a.total_length + b.total_length,
        truncated=a.truncated + b.truncated,
        max_id=max(a.max_id, b.max_id),
    )


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def sequence_column(
    name: str,
    array: pa.Array | pa.ChunkedArray,
    *,
    max_length: int | None,
    first_row: int = 0,
) -> tuple[pa.Array, SequenceFacts]:
    """Turn an input column of integer lists into the stored ``list<int32>`` column.

    Each row keeps its first ``max_length`` ids (all of them when ``None``). Empty
    sequences are allowed (length 0; batches give them an all-false mask).

    Args:
        name: The column, for messages.
        array: ``list``, ``large_list`` or ``fixed_size_list`` of integers (any width).
        max_length: Longest sequence kept (>= 1), or ``None``.
        first_row: The row number of ``array[0]`` in the whole column (for messages).

    Returns:
        The stored column and its facts (merge chunks' facts with
        :func:`merge_sequence_facts`).

    Raises:
        DataError: Another type, a bad ``max_length``, or (naming the first bad row) null
            rows, null ids, negative ids or ids >= 2**31 (ids are ``int32``).
    """
    if max_length is not None and (
        isinstance(max_length, bool) or not isinstance(max_length, int) or max_length < 1
    ):
        raise DataError(
            f"sequence column {name!r}: max_length must be an integer >= 1 or None, "
            f"got {max_length!r}"
        )
    array = v.as_array(array)
    if not (v.is_list_type(array.type) and pa.types.is_integer(array.type.value_type)):
        raise DataError(
            f"sequence column {name!r} has type {array.type}; a sequence must be a list of "
            "integer token ids per row"
        )
    if array.null_count:
        nulls = array.is_null().to_numpy(zero_copy_only=False)
        raise DataError(
            f"sequence column {name!r} has {array.null_count} null rows (the first at row "
            f"{first_row + _first(nulls)}); nulls are not allowed: use an empty list"
        )
    rows = len(array)
    lengths = pc.list_value_length(array).to_numpy(zero_copy_only=False).astype(np.int64)
    ids = array.flatten()
    value_type = array.type.value_type
    checks = [("null ids", ids.is_null(), "every id must be set")]
    if pa.types.is_signed_integer(value_type):
        checks.append(("negative ids", pc.less(ids, 0), "ids must be >= 0"))
    if value_type.bit_width > 32 or value_type == pa.uint32():
        checks.append(
            ("ids >= 2**31", pc.greater_equal(ids, _ID_LIMIT), "ids are int32: at most 2**31 - 1")
        )
    for what, bad, rule in checks:
        mask = pc.fill_null(bad, False).to_numpy(zero_copy_only=False)
        if mask.any():
            parents = np.repeat(np.arange(rows), lengths)
            raise DataError(
                f"sequence column {name!r} has {int(mask.sum())} {what} (the first at row "
                f"{first_row + int(parents[_first(mask)])}); {rule}"
            )
    stored = array.cast(pa.list_(pa.int32())) if len(array) else pa.array([], pa.list_(pa.int32()))
    truncated = 0
    if max_length is not None and rows and int(lengths.max()) > max_length:
        truncated = int((lengths > max_length).sum())
        stored = pc.list_slice(stored, 0, max_length)
    if not rows:
        return stored, NO_SEQUENCES
    kept = lengths if max_length is None else np.minimum(lengths, max_length)
    facts = SequenceFacts(
        min_length=int(kept.min()),
        max_length=int(kept.max()),
        total_length=int(kept.sum()),
        truncated=truncated,
        max_id=int(pc.max(ids).as_py()) if len(ids) else -1,
    )
    return stored, facts


def sequence_statistics(facts: SequenceFacts, rows: int) -> dict[str, Any]:
    """Statistics of a sequence column's train rows (stored lengths, after cutting).

    Returns:
        ``min_length``, ``max_length``, ``mean_length`` (a float) and ``truncated`` rows.
    """
    if facts.min_length < 0 or rows <= 0:
        return {"min_length": 0, "max_length": 0, "mean_length": 0.0, "truncated": 0}
    return {
        "min_length": facts.min_length,
        "max_length": facts.max_length,
        "mean_length": facts.total_length / rows,
        "truncated": facts.truncated,
    }


# -- kind inference ---------------------------------------------------------------------------


def _is_number(arrow_type: pa.DataType) -> bool:
    return bool(
        pa.types.is_integer(arrow_type)
        or pa.types.is_floating(arrow_type)
        or pa.types.is_boolean(arrow_type)
        or pa.types.is_decimal(arrow_type)
    )


def looks_ragged(array: pa.Array | pa.ChunkedArray) -> bool:
    """Whether a list column's lists have different lengths, at any nesting depth.

    Null rows are ignored; a ``fixed_size_list`` level is never ragged.
    """
    array = pc.drop_null(v.as_array(array))
    while v.is_list_type(array.type):
        if not pa.types.is_fixed_size_list(array.type) and len(array):
            lengths = pc.list_value_length(array)
            if pc.min(lengths).as_py() != pc.max(lengths).as_py():
                return True
        array = pc.drop_null(array.flatten())
    return False


def infer_kind(
    name: str,
    arrow_type: pa.DataType,
    array_sample: pa.Array | pa.ChunkedArray | None = None,
) -> str:
    """Infer a feature column's kind from its Arrow type (and a sample of its values).

    * ``number``: integers, floats, booleans, decimals. Integer columns are never
      inferred ``categorical``: name them so.
    * ``categorical``: strings, and dictionary-encoded strings, integers or booleans
      (e.g. a pandas ``category`` column: a categorical by declaration).
    * ``array``: (nested) lists of numbers, and Spark ML vectors. With a sample whose
      lists have different lengths (:func:`looks_ragged`), a one-level list of integers
      is a ``sequence`` instead; without a sample, lists are ``array`` (the caller may ask
      :func:`looks_ragged` itself).
    * ``image``: Spark's image struct, and binary columns (with a sample: only when its
      values carry JPEG or PNG magic, :func:`is_image_column`).

    Raises:
        DataError: Any other type, or a binary sample that is not images.
    """
    if pa.types.is_dictionary(arrow_type):
        value_type = arrow_type.value_type
        if (
            pa.types.is_string(value_type)
            or pa.types.is_large_string(value_type)
            or pa.types.is_integer(value_type)
            or pa.types.is_boolean(value_type)
        ):
            return "categorical"
        arrow_type = value_type
    if _is_number(arrow_type):
        return "number"
    if (
        pa.types.is_string(arrow_type)
        or pa.types.is_large_string(arrow_type)
        or pa.types.is_string_view(arrow_type)
    ):
        return "categorical"
    if is_spark_image_struct(arrow_type):
        return "image"
    if is_vector_type(arrow_type):
        return "array"
    if _is_binary(arrow_type):
        if array_sample is None or is_image_column(array_sample):
            return "image"
        raise DataError(
            f"feature column {name!r} has type {arrow_type} but its values are not JPEG or "
            "PNG images; a binary feature must hold encoded images"
        )
    if v.is_list_type(arrow_type):
        element = arrow_type
        depth = 0
        while v.is_list_type(element):
            element = element.value_type
            depth += 1
        if _is_number(element):
            if (
                depth == 1
                and pa.types.is_integer(element)
                and array_sample is not None
                and looks_ragged(array_sample)
            ):
                return "sequence"
            return "array"
    raise v.unsupported_feature(name, arrow_type)
