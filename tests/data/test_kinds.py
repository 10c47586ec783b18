"""Prepare-time encoders of the image, categorical and sequence kinds (no Spark, no torch)."""

from __future__ import annotations

import io
import logging
import re
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from PIL import Image

from cerebro_spark.data import UNKNOWN_ID
from cerebro_spark.data import _kinds as kinds
from cerebro_spark.errors import DataError

# -- helpers ----------------------------------------------------------------------------------


def _pixels(shape: tuple[int, ...], seed: int) -> np.ndarray:
    """A smooth image (JPEG keeps it close) with some noise, as uint8."""
    rng = np.random.default_rng(seed)
    ramp = np.linspace(0, 200, shape[1], dtype=np.float64)
    base = np.broadcast_to(ramp, shape[:2])
    if len(shape) == 3:
        base = np.stack([base * (c + 1) / shape[2] for c in range(shape[2])], axis=-1)
    return np.clip(base + rng.integers(0, 40, shape), 0, 255).astype(np.uint8)


def _encode(pixels: np.ndarray, fmt: str, mode: str | None = None, **options: Any) -> bytes:
    out = io.BytesIO()
    Image.fromarray(pixels, mode=mode).save(out, fmt, **options)
    return out.getvalue()


def _decode(data: bytes) -> Image.Image:
    image = Image.open(io.BytesIO(data))
    image.load()
    return image


GRAY_PNG = _encode(_pixels((8, 10), 1), "PNG")
GRAY_JPEG = _encode(_pixels((8, 10), 2), "JPEG", quality=90)
RGB_JPEG = _encode(_pixels((8, 10, 3), 3), "JPEG", quality=90)
RGB_PNG = _encode(_pixels((8, 10, 3), 4), "PNG")
BIG_RGB_JPEG = _encode(_pixels((12, 16, 3), 5), "JPEG", quality=90)
BIG_GRAY_PNG = _encode(_pixels((12, 16), 6), "PNG")


def _spark_row(pixels: np.ndarray, *, origin: str = "file:/x.png") -> dict[str, Any]:
    """A row of Spark's image source: BGR(A) bytes, OpenCV type by channel count."""
    height, width = pixels.shape[:2]
    channels = 1 if pixels.ndim == 2 else pixels.shape[2]
    if channels == 1:
        data = pixels.tobytes()
    else:
        bgr = pixels[:, :, [2, 1, 0, *range(3, channels)]]
        data = np.ascontiguousarray(bgr).tobytes()
    mode = {1: 0, 3: 16, 4: 24}[channels]
    return {
        "origin": origin,
        "height": height,
        "width": width,
        "nChannels": channels,
        "mode": mode,
        "data": data,
    }


SPARK_IMAGE = pa.struct(
    [
        ("origin", pa.string()),
        ("height", pa.int32()),
        ("width", pa.int32()),
        ("nChannels", pa.int32()),
        ("mode", pa.int32()),
        ("data", pa.binary()),
    ]
)


# -- image detection --------------------------------------------------------------------------


def test_image_encoding_by_magic() -> None:
    assert kinds.image_encoding(RGB_JPEG) == "jpeg"
    assert kinds.image_encoding(GRAY_PNG) == "png"
    assert kinds.image_encoding(b"GIF89a....") is None
    assert kinds.image_encoding(b"") is None
    assert kinds.image_encoding(b"\xff\xd8") is None


def test_is_image_column() -> None:
    assert kinds.is_image_column(pa.array([None, RGB_JPEG, GRAY_PNG]))
    assert kinds.is_image_column(pa.chunked_array([[RGB_JPEG], [GRAY_PNG]], pa.large_binary()))
    assert not kinds.is_image_column(pa.array([RGB_JPEG, b"not an image"]))
    # Only the first `sample` non-null values are looked at.
    assert kinds.is_image_column(pa.array([RGB_JPEG, GRAY_PNG, b"late"]), sample=2)
    assert not kinds.is_image_column(pa.array([], pa.binary()))
    assert not kinds.is_image_column(pa.array([None, None], pa.binary()))
    assert not kinds.is_image_column(pa.array(["a", "b"]))
    assert kinds.is_image_column(pa.array([], SPARK_IMAGE))
    assert kinds.is_spark_image_struct(SPARK_IMAGE)
    renamed = pa.struct([("origin", pa.string()), ("pixels", pa.binary())])
    assert not kinds.is_spark_image_struct(renamed)
    assert not kinds.is_spark_image_struct(pa.binary())


# -- image columns ----------------------------------------------------------------------------


def test_images_of_the_column_size_and_mode_are_kept_byte_for_byte() -> None:
    stored, facts = kinds.image_column("img", pa.array([RGB_JPEG, RGB_PNG], pa.large_binary()))
    assert stored.type == pa.binary()
    assert stored.to_pylist() == [RGB_JPEG, RGB_PNG]
    assert facts == kinds.ImageFacts("mixed", (3, 8, 10))

    stored, facts = kinds.image_column("img", pa.array([GRAY_PNG, GRAY_JPEG]), size=(8, 10))
    assert stored.to_pylist() == [GRAY_PNG, GRAY_JPEG]
    assert facts.shape == (1, 8, 10)

    _, facts = kinds.image_column("img", pa.array([RGB_JPEG, RGB_JPEG]))
    assert facts.encoding == "jpeg"


def test_channels_none_keeps_grayscale_images_in_a_color_column() -> None:
    stored, facts = kinds.image_column("img", pa.array([GRAY_PNG, RGB_JPEG]))
    assert facts.shape == (3, 8, 10)
    assert stored.to_pylist() == [GRAY_PNG, RGB_JPEG]
    gray = kinds.decode_image(stored[0].as_py(), facts.shape)
    assert gray.shape == (3, 8, 10) and gray.dtype == np.uint8
    expected = np.asarray(_decode(GRAY_PNG))
    for c in range(3):
        np.testing.assert_array_equal(gray[c], expected)


def test_channels_converts_and_reencodes_in_the_own_encoding() -> None:
    stored, facts = kinds.image_column("img", pa.array([RGB_JPEG, GRAY_PNG]), channels=1)
    assert facts == kinds.ImageFacts("mixed", (1, 8, 10))
    jpeg, png = stored.to_pylist()
    assert png == GRAY_PNG  # already grayscale: kept
    assert jpeg != RGB_JPEG and kinds.image_encoding(jpeg) == "jpeg"
    assert _decode(jpeg).mode == "L"
    luma = np.asarray(_decode(RGB_JPEG).convert("L"), dtype=np.int64)
    assert np.abs(np.asarray(_decode(jpeg), dtype=np.int64) - luma).max() <= 3

    stored, facts = kinds.image_column("img", pa.array([GRAY_PNG]), channels=3)
    assert facts == kinds.ImageFacts("png", (3, 8, 10))
    image = _decode(stored[0].as_py())
    assert image.mode == "RGB"
    # PNG is lossless: the gray values are replicated exactly.
    np.testing.assert_array_equal(np.asarray(image)[:, :, 1], np.asarray(_decode(GRAY_PNG)))


def test_other_modes_become_l_or_rgb() -> None:
    rgba = _pixels((8, 10, 4), 7)
    palette = Image.fromarray(_pixels((8, 10, 3), 8)).convert("P")
    out = io.BytesIO()
    palette.save(out, "PNG", transparency=0)
    deep = (_pixels((8, 10), 9).astype(np.uint16) << 8) | 0x7F  # 16-bit grayscale
    with_profile = _encode(rgba, "PNG", icc_profile=b"not really a profile")
    assert _decode(with_profile).info["icc_profile"] == b"not really a profile"
    assert "transparency" in _decode(out.getvalue()).info
    column = pa.array([with_profile, out.getvalue(), _encode(deep, "PNG")])
    stored, facts = kinds.image_column("img", column)
    assert facts == kinds.ImageFacts("png", (3, 8, 10))
    rgb, from_palette, gray = (_decode(data) for data in stored.to_pylist())
    assert (rgb.mode, from_palette.mode, gray.mode) == ("RGB", "RGB", "L")
    np.testing.assert_array_equal(np.asarray(rgb), rgba[:, :, :3])  # alpha dropped
    np.testing.assert_array_equal(np.asarray(from_palette), np.asarray(palette.convert("RGB")))
    np.testing.assert_array_equal(np.asarray(gray), _pixels((8, 10), 9))  # the high byte
    # Re-encoded images carry no metadata (no profile, no transparency chunk).
    assert "icc_profile" not in rgb.info and "transparency" not in from_palette.info


def test_resize_is_deterministic_and_chunking_does_not_matter() -> None:
    column = pa.array([RGB_JPEG, BIG_RGB_JPEG, GRAY_PNG, BIG_GRAY_PNG, RGB_PNG])
    whole, facts = kinds.image_column("img", column, size=(6, 7))
    again, _ = kinds.image_column("img", column, size=(6, 7))
    assert whole.to_pylist() == again.to_pylist()
    assert facts == kinds.ImageFacts("mixed", (3, 6, 7))

    head, head_facts = kinds.image_column("img", column.slice(0, 2), size=(6, 7))
    tail, tail_facts = kinds.image_column("img", column.slice(2), size=(6, 7), first_row=2)
    assert head.to_pylist() + tail.to_pylist() == whole.to_pylist()
    assert kinds.merge_facts("img", head_facts, tail_facts) == facts

    gray_head, gray_facts = kinds.image_column("img", column.slice(2, 2), size=(6, 7))
    assert gray_facts.shape == (1, 6, 7)  # a grayscale chunk alone
    assert gray_head.to_pylist() == whole.to_pylist()[2:4]
    for data, encoding in zip(
        whole.to_pylist(), ["jpeg", "jpeg", "png", "png", "png"], strict=True
    ):
        image = _decode(data)
        assert kinds.image_encoding(data) == encoding
        assert image.size == (7, 6)
    # The re-encoding settings are the documented ones.
    resized = _decode(BIG_RGB_JPEG).resize((7, 6), Image.Resampling.BILINEAR)
    out = io.BytesIO()
    resized.save(out, "JPEG", quality=95, subsampling=0, optimize=False, progressive=False)
    assert whole[1].as_py() == out.getvalue()


def test_images_of_several_sizes_need_a_size() -> None:
    column = pa.array([RGB_JPEG, RGB_PNG, BIG_RGB_JPEG])
    message = (
        "image column 'img' holds images of different sizes (height x width): 8x10 first "
        "seen at row 100 and 12x16 first seen at row 102; every image must have one size: "
        "pass --image-size H W to resize them"
    )
    with pytest.raises(DataError, match=re.escape(message)):
        kinds.image_column("img", column, first_row=100)
    _, a = kinds.image_column("img", column.slice(0, 2), first_row=100)
    _, b = kinds.image_column("img", column.slice(2), first_row=102)
    with pytest.raises(DataError, match=re.escape(message)):
        kinds.merge_facts("img", a, b)


def test_merge_facts() -> None:
    jpeg = kinds.ImageFacts("jpeg", (1, 4, 5), 0)
    png = kinds.ImageFacts("png", (3, 4, 5), 9)
    assert kinds.merge_facts("img", jpeg, png) == kinds.ImageFacts("mixed", (3, 4, 5), 0)
    assert kinds.merge_facts("img", jpeg, jpeg) == jpeg
    empty_array, empty = kinds.image_column("img", pa.array([], pa.binary()), first_row=3)
    assert len(empty_array) == 0 and empty.empty
    assert kinds.merge_facts("img", empty, png) == png
    assert kinds.merge_facts("img", png, empty) == png


@pytest.mark.parametrize("cut", [20, 200, len(RGB_JPEG) // 2])
def test_a_truncated_jpeg_is_refused_naming_the_row(cut: int) -> None:
    column = pa.array([RGB_JPEG, RGB_JPEG[:cut]])
    with pytest.raises(
        DataError, match=r"image column 'img' row 41 is a JPEG that does not decode"
    ):
        kinds.image_column("img", column, first_row=40)


def test_values_that_are_not_images_are_refused_naming_the_row() -> None:
    with pytest.raises(DataError, match=r"image column 'img' row 1 is not a JPEG or PNG image"):
        kinds.image_column("img", pa.array([GRAY_PNG, b"GIF89a"]))
    with pytest.raises(DataError, match=r"image column 'img' row 8 is null"):
        kinds.image_column("img", pa.array([GRAY_PNG, None]), first_row=7)
    with pytest.raises(DataError, match=r"image column 'img' has type string"):
        kinds.image_column("img", pa.array(["a.png"]))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"size": (0, 4)}, "image size must be two integers (height, width) >= 1, got (0, 4)"),
        ({"size": (4,)}, "image size must be two integers"),
        ({"channels": 2}, "image channels must be 1 (grayscale) or 3 (RGB), got 2"),
        ({"channels": True}, "image channels must be 1 (grayscale) or 3 (RGB), got True"),
    ],
)
def test_bad_image_arguments(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)):
        kinds.image_column("img", pa.array([GRAY_PNG]), **kwargs)


def test_spark_image_rows_become_rgb_pngs() -> None:
    color = _pixels((5, 6, 3), 10)
    alpha = _pixels((5, 6, 4), 11)
    gray = _pixels((5, 6), 12)
    rows = [_spark_row(color), _spark_row(alpha), _spark_row(gray)]
    stored, facts = kinds.image_column("img", pa.array(rows, SPARK_IMAGE))
    assert facts == kinds.ImageFacts("png", (3, 5, 6))
    decoded = [_decode(data) for data in stored.to_pylist()]
    assert [image.mode for image in decoded] == ["RGB", "RGB", "L"]
    np.testing.assert_array_equal(np.asarray(decoded[0]), color)  # BGR -> RGB, lossless
    np.testing.assert_array_equal(np.asarray(decoded[1]), alpha[:, :, :3])
    np.testing.assert_array_equal(np.asarray(decoded[2]), gray)
    np.testing.assert_array_equal(
        kinds.decode_image(stored[0].as_py(), facts.shape), color.transpose(2, 0, 1)
    )
    again, _ = kinds.image_column("img", pa.array(rows, SPARK_IMAGE))
    assert again.to_pylist() == stored.to_pylist()


def test_bad_spark_image_rows_are_refused() -> None:
    good = _spark_row(_pixels((5, 6, 3), 13))
    undefined = {**good, "origin": "file:/bad.jpg", "height": -1, "width": -1, "nChannels": -1}
    undefined.update(mode=-1, data=b"")
    short = {**good, "data": good["data"][:-1]}
    odd_mode = {**good, "mode": 24}
    cases = [
        (undefined, "row 1 (origin 'file:/bad.jpg') is an image Spark could not read"),
        (short, "row 1 (origin 'file:/x.png') has 89 bytes of pixel data; 5 x 6 x 3"),
        (odd_mode, "row 1 (origin 'file:/x.png') has mode 24 with nChannels 3"),
        (None, "row 1 is null"),
    ]
    for bad, message in cases:
        with pytest.raises(DataError, match=re.escape(f"image column 'img' {message}")):
            kinds.image_column("img", pa.array([good, bad], SPARK_IMAGE))


def test_decode_image() -> None:
    pixels = _pixels((8, 10, 3), 4)
    np.testing.assert_array_equal(
        kinds.decode_image(RGB_PNG, (3, 8, 10)), pixels.transpose(2, 0, 1)
    )
    gray = kinds.decode_image(RGB_PNG, (1, 8, 10))
    np.testing.assert_array_equal(gray[0], np.asarray(Image.fromarray(pixels).convert("L")))
    with pytest.raises(DataError, match=r"stored image is 8x10 \(height x width\)"):
        kinds.decode_image(RGB_PNG, (3, 10, 8))
    with pytest.raises(DataError, match="does not decode"):
        kinds.decode_image(RGB_PNG[:100], (3, 8, 10))


def test_image_moments_and_statistics() -> None:
    stored, facts = kinds.image_column("img", pa.array([RGB_PNG, GRAY_PNG, RGB_JPEG]))
    pixels = np.stack([kinds.decode_image(d, facts.shape) for d in stored.to_pylist()])
    scaled = pixels.astype(np.float64) / 255
    moments = kinds.image_moments(stored, facts.shape)
    assert moments.shape == (3, 3) and moments.dtype == np.float64
    per_channel = scaled.transpose(1, 0, 2, 3).reshape(3, -1)
    np.testing.assert_array_equal(moments[:, 0], [per_channel.shape[1]] * 3)
    np.testing.assert_allclose(moments[:, 1], per_channel.sum(axis=1), rtol=1e-13)
    np.testing.assert_allclose(moments[:, 2], (per_channel**2).sum(axis=1), rtol=1e-13)

    parts = [kinds.image_moments(stored.slice(0, 1), facts.shape)]
    parts.append(kinds.image_moments(stored.slice(1), facts.shape))
    stats = kinds.image_statistics(parts)
    assert set(stats) == {"mean", "std"}
    assert all(type(x) is float for x in stats["mean"] + stats["std"])
    np.testing.assert_allclose(stats["mean"], per_channel.mean(axis=1), rtol=1e-12)
    np.testing.assert_allclose(stats["std"], per_channel.std(axis=1), rtol=1e-9)
    assert kinds.image_statistics(parts) == stats  # same order, same floats

    with pytest.raises(DataError, match="at least one partition"):
        kinds.image_statistics([])
    with pytest.raises(DataError, match="cannot be combined"):
        kinds.image_statistics([parts[0], parts[0][:1]])


# -- categories -------------------------------------------------------------------------------


def test_category_values() -> None:
    assert kinds.category_values("c", pa.array(["a", "b"], pa.large_string())).type == pa.string()
    ints = kinds.category_values("c", pa.array([3, 200], pa.uint8()))
    assert ints.type == pa.int64() and ints.to_pylist() == [3, 200]
    assert kinds.category_values("c", pa.array([True, False])).to_pylist() == [1, 0]
    encoded = pa.array(["x", "y", "x"]).dictionary_encode()
    assert kinds.category_values("c", encoded).to_pylist() == ["x", "y", "x"]
    chunked = pa.chunked_array([["a"], ["b"]])
    assert kinds.category_values("c", chunked).to_pylist() == ["a", "b"]

    with pytest.raises(
        DataError,
        match=re.escape(
            "categorical column 'c' has 2 null values of 3 rows; nulls are not allowed: fill "
            "them with a value of their own"
        ),
    ):
        kinds.category_values("c", pa.array(["a", None, None]))
    with pytest.raises(DataError, match="categorical column 'c' has type double"):
        kinds.category_values("c", pa.array([1.5]))
    with pytest.raises(DataError, match="does not fit int64"):
        kinds.category_values("c", pa.array([2**64 - 1], pa.uint64()))


def test_counts_and_their_merge() -> None:
    counts = kinds.count_categories(pa.array(["b", "a", "b", "c"]))
    assert counts == {"a": 1, "b": 2, "c": 1} and list(counts) == ["a", "b", "c"]
    merged = kinds.merge_counts(counts, kinds.count_categories(pa.array(["d", "a"])))
    assert merged == {"a": 2, "b": 2, "c": 1, "d": 1}
    assert list(merged) == ["a", "b", "c", "d"]
    assert kinds.count_categories(pa.array([5, 5, -1])) == {-1: 1, 5: 2}


def test_vocabulary_order_limit_and_ties(caplog: pytest.LogCaptureFixture) -> None:
    counts = {"pear": 3, "apple": 3, "fig": 5, "kiwi": 1, "date": 1}
    assert kinds.build_vocabulary("c", counts, limit=10, hash_buckets=4) == (
        ("fig", "apple", "pear", "date", "kiwi"),
        0,
    )
    with caplog.at_level(logging.INFO, logger="cerebro_spark.data._kinds"):
        assert kinds.build_vocabulary("c", counts, limit=2, hash_buckets=0) == (
            ("fig", "apple"),
            0,
        )
    assert "3 values (5 rows) beyond the vocabulary of 2 map to the unknown id 0" in caplog.text
    assert kinds.build_vocabulary("c", counts, limit=3, hash_buckets=4) == (
        ("fig", "apple", "pear"),
        4,
    )
    assert kinds.build_vocabulary("c", {10: 2, 2: 2, 7: 3}, limit=2, hash_buckets=0) == (
        (7, 2),
        0,
    )


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"limit": 0, "hash_buckets": 0}, "the vocabulary limit must be an integer >= 1, got 0"),
        ({"limit": True, "hash_buckets": 0}, "the vocabulary limit must be an integer >= 1"),
        ({"limit": 5, "hash_buckets": -1}, "hash_buckets must be an integer >= 0, got -1"),
        (
            {"limit": 5, "hash_buckets": 2**31 - 4},
            "categorical column 'c' would have 2147483648 ids (1 unknown + 3 vocabulary "
            "values + 2147483644 hash buckets); ids are int32, so at most 2147483647",
        ),
    ],
)
def test_vocabulary_refusals(kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(DataError, match=re.escape(message)):
        kinds.build_vocabulary("c", {"a": 1, "b": 2, "c": 3}, **kwargs)


def test_the_largest_cardinality_is_accepted() -> None:
    counts = {"a": 1, "b": 2, "c": 3}
    assert kinds.build_vocabulary("c", counts, limit=2, hash_buckets=2**31 - 4) == (
        ("c", "b"),
        2**31 - 4,
    )


def _reference_hash(data: bytes) -> int:
    """FNV-1a 64 then MurmurHash3's fmix64, one byte at a time in Python."""
    mask = 2**64 - 1
    h = 0xCBF29CE484222325
    for byte in data:
        h = ((h ^ byte) * 0x100000001B3) & mask
    h ^= h >> 33
    h = (h * 0xFF51AFD7ED558CCD) & mask
    h ^= h >> 33
    h = (h * 0xC4CEB9FE1A85EC53) & mask
    return h ^ (h >> 33)


def test_category_hash_is_pinned() -> None:
    # A change of these values changes the ids of every stored dataset's hashed values.
    strings = kinds.category_hash(pa.array(["", "a", "cat"]))
    assert strings.dtype == np.uint64
    assert [int(h) for h in strings] == [
        0xEFD01F60BA992926,
        0x82A2A958A9BECE5B,
        0x98E25A302C6EB1D4,
    ]
    ints = kinds.category_hash(pa.array([0, 1, -1]))
    assert [int(h) for h in ints] == [0x7BD3144F29C0CC9E, 0x4A3A3A4BA6523826, 0x6A92C0228678C02E]
    assert int(ints[2]) == _reference_hash((-1).to_bytes(8, "little", signed=True))


def test_category_hash_matches_the_reference_on_every_path() -> None:
    rng = np.random.default_rng(0)
    words = ["".join(rng.choice(list("abcü€z "), size=rng.integers(0, 30))) for _ in range(3000)]
    words[5] = "long" * 1000  # a tail finished one row at a time
    array = pa.array(words)
    hashes = kinds.category_hash(array)
    assert [int(h) for h in hashes] == [_reference_hash(w.encode()) for w in words]
    np.testing.assert_array_equal(kinds.category_hash(array.slice(7, 100)), hashes[7:107])
    np.testing.assert_array_equal(kinds.category_hash(array.cast(pa.large_string())), hashes)
    np.testing.assert_array_equal(kinds.category_hash(array.dictionary_encode()), hashes)
    values = rng.integers(-(2**62), 2**62, 500)
    int_hashes = kinds.category_hash(pa.array(values))
    expected = [_reference_hash(int(x).to_bytes(8, "little", signed=True)) for x in values]
    assert [int(h) for h in int_hashes] == expected
    small = [0, 1, -1, 70000, -(2**31)]
    np.testing.assert_array_equal(
        kinds.category_hash(pa.array(small, pa.int32())), kinds.category_hash(pa.array(small))
    )
    # The low bits are well spread (power-of-two bucket counts are fine).
    spread = np.bincount(kinds.category_hash(pa.array(range(8000))) % np.uint64(8), minlength=8)
    assert spread.min() > 850 and spread.max() < 1150


def test_encode_categories() -> None:
    vocabulary = ("fig", "apple")
    values = pa.array(["apple", "fig", "kiwi", "date", "fig"])
    ids = kinds.encode_categories("c", values, vocabulary, 0)
    assert ids.type == pa.int32()
    assert ids.to_pylist() == [2, 1, UNKNOWN_ID, UNKNOWN_ID, 1]

    hashed = kinds.encode_categories("c", values, vocabulary, 5)
    buckets = kinds.category_hash(pa.array(["kiwi", "date"])) % np.uint64(5)
    assert hashed.to_pylist() == [2, 1, 3 + int(buckets[0]), 3 + int(buckets[1]), 1]
    chunks = [kinds.encode_categories("c", values.slice(i, 2), vocabulary, 5) for i in (0, 2, 4)]
    assert [i for chunk in chunks for i in chunk.to_pylist()] == hashed.to_pylist()

    ints = kinds.encode_categories("c", pa.array([7, 2, 9], pa.int16()), (7, 2), 0)
    assert ints.to_pylist() == [1, 2, UNKNOWN_ID]
    with pytest.raises(DataError, match="categorical column 'c' holds string values, but its"):
        kinds.encode_categories("c", values, (1, 2), 0)
    with pytest.raises(DataError, match="holds a value twice"):
        kinds.encode_categories("c", values, ("fig", "fig"), 0)
    with pytest.raises(DataError, match="ids are int32"):
        kinds.encode_categories("c", values, vocabulary, 2**31 - 3)


def test_category_statistics() -> None:
    counts = {"fig": 5, "apple": 3, "pear": 3, "kiwi": 1}
    assert kinds.category_statistics(counts, ("fig", "apple"), 0) == {
        "rows": 12,
        "distinct": 4,
        "unknown": 4,
        "hashed": 0,
    }
    assert kinds.category_statistics(counts, ("fig", "apple"), 8) == {
        "rows": 12,
        "distinct": 4,
        "unknown": 0,
        "hashed": 4,
    }


# -- sequences --------------------------------------------------------------------------------


def test_sequences_are_cut_and_described() -> None:
    column = pa.array([[1, 2, 3, 4], [5], [], [9, 8, 7]], pa.list_(pa.int64()))
    stored, facts = kinds.sequence_column("s", column, max_length=3)
    assert stored.type == pa.list_(pa.int32())
    assert stored.to_pylist() == [[1, 2, 3], [5], [], [9, 8, 7]]
    # Stored lengths (after the cut); max_id over every input id.
    assert facts == kinds.SequenceFacts(
        min_length=0, max_length=3, total_length=7, truncated=1, max_id=9
    )
    assert kinds.sequence_statistics(facts, 4) == {
        "min_length": 0,
        "max_length": 3,
        "mean_length": 1.75,
        "truncated": 1,
    }
    cut_ids, cut_facts = kinds.sequence_column("s", pa.array([[1, 50], [2]]), max_length=1)
    assert cut_ids.to_pylist() == [[1], [2]] and cut_facts.max_id == 50
    whole, whole_facts = kinds.sequence_column("s", column, max_length=None)
    assert whole.to_pylist() == column.to_pylist()
    assert whole_facts == kinds.SequenceFacts(0, 4, 8, 0, 9)

    head, a = kinds.sequence_column("s", column.slice(0, 1), max_length=3)
    tail, b = kinds.sequence_column("s", column.slice(1), max_length=3, first_row=1)
    assert head.to_pylist() + tail.to_pylist() == stored.to_pylist()
    assert kinds.merge_sequence_facts(a, b) == facts

    empty, none = kinds.sequence_column("s", column.slice(0, 0), max_length=3)
    assert len(empty) == 0 and none == kinds.NO_SEQUENCES
    assert kinds.merge_sequence_facts(none, facts) == facts
    assert kinds.merge_sequence_facts(facts, none) == facts

    other_types = [
        pa.array([[1, 2], [3, 4]], pa.list_(pa.uint8(), 2)),
        pa.array([[1, 2], [3, 4]], pa.large_list(pa.uint32())),
    ]
    for array in other_types:
        stored, _ = kinds.sequence_column("s", array, max_length=1)
        assert stored.type == pa.list_(pa.int32()) and stored.to_pylist() == [[1], [3]]


@pytest.mark.parametrize(
    ("rows", "message"),
    [
        ([[1], None, None], "has 2 null rows (the first at row 11)"),
        ([[1], [2, None]], "has 1 null ids (the first at row 11)"),
        ([[1], [0], [3, -2, -5]], "has 2 negative ids (the first at row 12); ids must be >= 0"),
        ([[2**31 - 1], [2**31]], "has 1 ids >= 2**31 (the first at row 11); ids are int32"),
    ],
)
def test_bad_sequences_are_refused_naming_the_first_row(rows: list[Any], message: str) -> None:
    with pytest.raises(DataError, match=re.escape(f"sequence column 's' {message}")):
        kinds.sequence_column("s", pa.array(rows, pa.list_(pa.int64())), max_length=4, first_row=10)


def test_bad_sequence_arguments() -> None:
    column = pa.array([[1]])
    for bad in (0, -1, True, 2.0):
        with pytest.raises(DataError, match="max_length must be an integer >= 1 or None"):
            kinds.sequence_column("s", column, max_length=bad)  # type: ignore[arg-type]
    with pytest.raises(DataError, match="sequence column 's' has type list<item: double>"):
        kinds.sequence_column("s", pa.array([[1.5]]), max_length=None)
    with pytest.raises(DataError, match="sequence column 's' has type int64"):
        kinds.sequence_column("s", pa.array([1]), max_length=None)


# -- kind inference ---------------------------------------------------------------------------


def test_infer_kind() -> None:
    infer = kinds.infer_kind
    assert infer("x", pa.float32()) == "number"
    assert infer("x", pa.int64()) == "number"  # never inferred categorical
    assert infer("x", pa.bool_()) == "number"
    assert infer("x", pa.string()) == "categorical"
    assert infer("x", pa.dictionary(pa.int32(), pa.int64())) == "categorical"
    assert infer("x", pa.list_(pa.float32(), 4)) == "array"
    assert infer("x", pa.list_(pa.list_(pa.float64()))) == "array"
    assert infer("x", pa.list_(pa.int64())) == "array"  # no sample: the caller decides
    ragged = pa.array([[1, 2], [3]])
    assert kinds.looks_ragged(ragged) and not kinds.looks_ragged(pa.array([[1], None, [2]]))
    assert kinds.looks_ragged(pa.array([[[1], [2]], [[3], [4, 5]]]))
    assert infer("x", ragged.type, ragged) == "sequence"
    assert infer("x", pa.list_(pa.int64()), pa.array([[1, 2], [3, 4]])) == "array"
    assert infer("x", pa.list_(pa.float64()), pa.array([[1.0], [2.0, 3.0]])) == "array"
    assert infer("x", pa.binary(), pa.array([RGB_JPEG, GRAY_PNG])) == "image"
    assert infer("x", pa.binary()) == "image"
    assert infer("x", SPARK_IMAGE) == "image"
    vector = pa.struct(
        [
            ("type", pa.int8()),
            ("size", pa.int32()),
            ("indices", pa.list_(pa.int32())),
            ("values", pa.list_(pa.float64())),
        ]
    )
    assert infer("x", vector) == "array"
    with pytest.raises(DataError, match="its values are not JPEG or PNG images"):
        infer("x", pa.binary(), pa.array([b"abc"]))
    with pytest.raises(DataError, match=r"feature column 'x' has type timestamp\[s\]; features"):
        infer("x", pa.timestamp("s"))
    with pytest.raises(DataError, match="has type list<item: string>"):
        infer("x", pa.list_(pa.string()))
