"""Per-batch image ops: exact decode, crop/flip semantics, seeded replay, the tensor."""

from __future__ import annotations

import io
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest
from PIL import Image

from cerebro_spark.data import ColumnInfo, HeldColumn
from cerebro_spark.errors import ConfigError, DataError
from cerebro_spark.training._images import (
    AUGMENT_STREAM,
    Augmentation,
    _decode_jpeg,
    _jpeg_frame,
    augment,
    batch_seed,
    decode_images,
    decode_on_device,
    normalization,
    to_tensor,
)


def encode_image(image: Image.Image, fmt: str, **options: object) -> bytes:
    buffer = io.BytesIO()
    image.save(buffer, format=fmt, **options)
    return buffer.getvalue()


def encode(pixels: np.ndarray, fmt: str, **options: object) -> bytes:
    return encode_image(Image.fromarray(pixels), fmt, **options)


def held(
    blobs: list[bytes], shape: tuple[int, int, int], encoding: str = "png", **fields: object
) -> HeldColumn:
    offsets = np.zeros(len(blobs) + 1, dtype=np.int64)
    offsets[1:] = np.cumsum([len(blob) for blob in blobs])
    values = np.frombuffer(b"".join(blobs), dtype=np.uint8)
    info = ColumnInfo("pixels", "uint8", shape, kind="image", encoding=encoding, **fields)  # type: ignore[arg-type]
    return HeldColumn(info, values, offsets)


def random_pixels(rng: np.random.Generator, count: int, height: int, width: int, channels: int):
    shape = (count, height, width, channels) if channels == 3 else (count, height, width)
    return rng.integers(0, 256, size=shape, dtype=np.uint8)


@pytest.fixture
def rgb() -> tuple[HeldColumn, np.ndarray]:
    pixels = random_pixels(np.random.default_rng(0), 6, 5, 7, 3)
    column = held([encode(p, "PNG") for p in pixels], (3, 5, 7))
    return column, pixels.transpose(0, 3, 1, 2)


def test_decode_is_exact_for_png_in_row_order(rgb: tuple[HeldColumn, np.ndarray]) -> None:
    column, pixels = rgb
    rows = np.array([4, 0, 4, 2])
    images = decode_images(column, rows)
    assert images.dtype == np.uint8 and images.shape == (4, 3, 5, 7)
    assert images.flags.c_contiguous
    np.testing.assert_array_equal(images, pixels[rows])
    assert decode_images(column, np.array([], dtype=np.int64)).shape == (0, 3, 5, 7)


def test_decode_grayscale_and_jpeg_match_pil() -> None:
    rng = np.random.default_rng(1)
    gray = random_pixels(rng, 3, 8, 6, 1)
    column = held([encode(p, "PNG") for p in gray], (1, 8, 6))
    np.testing.assert_array_equal(decode_images(column, np.arange(3))[:, 0], gray)
    color = random_pixels(rng, 3, 8, 6, 3)
    blobs = [encode(p, "JPEG", quality=90) for p in color]
    as_rgb = decode_images(held(blobs, (3, 8, 6), "jpeg"), np.array([2, 1]))
    as_gray = decode_images(held(blobs, (1, 8, 6), "jpeg"), np.array([2, 1]))
    for k, row in enumerate((2, 1)):
        with Image.open(io.BytesIO(blobs[row])) as image:
            np.testing.assert_array_equal(
                as_rgb[k], np.asarray(image.convert("RGB")).transpose(2, 0, 1)
            )
            np.testing.assert_array_equal(as_gray[k, 0], np.asarray(image.convert("L")))


def jpeg_variants() -> dict[str, bytes]:
    """JPEGs as encoders write them: subsamplings, progressive, metadata, gray, CMYK."""
    rng = np.random.default_rng(8)
    smooth = np.linspace(0, 255, 9 * 13 * 3).reshape(9, 13, 3).astype(np.uint8)
    noisy = random_pixels(rng, 1, 9, 13, 3)[0]
    exif = Image.Exif()
    exif[0x0112] = 6  # an orientation tag: PIL does not rotate on decode
    return {
        "420": encode(smooth, "JPEG", quality=90),
        "444": encode(noisy, "JPEG", quality=95, subsampling=0),
        "progressive": encode(noisy, "JPEG", progressive=True, optimize=True),
        "metadata": encode(smooth, "JPEG", exif=exif.tobytes(), icc_profile=b"\0" * 300),
        "gray": encode(noisy[:, :, 0], "JPEG"),
        "cmyk": encode_image(Image.fromarray(noisy).convert("CMYK"), "JPEG"),
        "png": encode(noisy, "PNG"),
    }


def pil_decode(blob: bytes, mode: str) -> np.ndarray:
    with Image.open(io.BytesIO(blob)) as image:
        pixels = np.asarray(image.convert(mode))
    return pixels[None] if mode == "L" else pixels.transpose(2, 0, 1)


@pytest.mark.parametrize("encoding", ["jpeg", "mixed"])
def test_every_jpeg_variant_decodes_as_image_open_and_convert(encoding: str) -> None:
    variants = jpeg_variants()
    for channels, mode in ((3, "RGB"), (1, "L")):
        column = held(list(variants.values()), (channels, 9, 13), encoding)
        images = decode_images(column, np.arange(column.rows))
        for k, (name, blob) in enumerate(variants.items()):
            np.testing.assert_array_equal(images[k], pil_decode(blob, mode), err_msg=name)


def test_the_direct_jpeg_path_is_taken_only_where_it_is_exact() -> None:
    variants = jpeg_variants()
    for name, blob in variants.items():
        with Image.open(io.BytesIO(blob)) as image:
            bits, layers, size = image.bits if name != "png" else 8, len(image.mode), image.size
        frame = _jpeg_frame(blob)
        assert frame == (None if name == "png" else (bits, size[1], size[0], layers)), name
    direct = _decode_jpeg(variants["444"], "RGB", 9, 13)
    assert direct is not None
    np.testing.assert_array_equal(direct.transpose(2, 0, 1), pil_decode(variants["444"], "RGB"))
    assert _decode_jpeg(variants["gray"], "L", 9, 13) is not None
    assert _decode_jpeg(variants["gray"], "RGB", 9, 13) is None  # converted by PIL
    assert _decode_jpeg(variants["420"], "L", 9, 13) is None  # PIL's RGB -> L, not luma
    assert _decode_jpeg(variants["cmyk"], "RGB", 9, 13) is None
    assert _decode_jpeg(variants["420"], "RGB", 9, 12) is None  # another size
    assert _decode_jpeg(variants["420"][:-30], "RGB", 9, 13) is None  # truncated


def test_a_jpeg_of_another_size_or_truncated_is_refused() -> None:
    pixels = random_pixels(np.random.default_rng(9), 3, 8, 8, 3)
    blobs = [encode(p, "JPEG") for p in pixels]
    blobs[1] = encode(pixels[1][:7], "JPEG")
    blobs[2] = blobs[2][: len(blobs[2]) // 2]
    column = held(blobs, (3, 8, 8), "jpeg")
    with pytest.raises(DataError, match=r"row 1 of image column 'pixels' decodes to 8x7"):
        decode_images(column, np.array([0, 1]))
    with pytest.raises(DataError, match=r"row 2 of image column 'pixels' .* does not decode"):
        decode_images(column, np.array([0, 2]))


def test_a_value_that_does_not_decode_names_column_and_row(
    rgb: tuple[HeldColumn, np.ndarray],
) -> None:
    column, _ = rgb
    blobs = [column.row(i).tobytes() for i in range(column.rows)]
    blobs[3] = b"not an image at all"
    broken = held(blobs, (3, 5, 7))
    np.testing.assert_array_equal(decode_images(broken, np.array([0, 1])), rgb[1][:2])
    with pytest.raises(DataError, match=r"row 3 of image column 'pixels' .* does not decode"):
        decode_images(broken, np.array([0, 3]))
    blobs[3] = column.row(3).tobytes()[:-40]  # a truncated PNG
    with pytest.raises(DataError, match=r"row 3 of image column 'pixels'"):
        decode_images(held(blobs, (3, 5, 7)), np.array([3]))


def test_an_image_of_another_size_is_refused() -> None:
    pixels = random_pixels(np.random.default_rng(2), 3, 5, 7, 3)
    blobs = [encode(p, "PNG") for p in pixels]
    blobs[1] = encode(pixels[1][:, :6], "PNG")
    with pytest.raises(DataError, match=r"row 1 of image column 'pixels' decodes to 6x5 .* 7x5"):
        decode_images(held(blobs, (3, 5, 7)), np.arange(3))


def test_decode_refuses_bad_rows_and_columns(rgb: tuple[HeldColumn, np.ndarray]) -> None:
    column, _ = rgb
    with pytest.raises(DataError, match=r"row 6 of image column 'pixels' is out of range"):
        decode_images(column, np.array([0, 6]))
    with pytest.raises(DataError, match=r"row -1 .* out of range"):
        decode_images(column, np.array([-1]))
    with pytest.raises(DataError, match="1-D integer array"):
        decode_images(column, np.array([0.5]))
    dense = HeldColumn(ColumnInfo("x", "float32", (3,), kind="array"), np.zeros((2, 3), np.float32))
    with pytest.raises(DataError, match="'x' is a array column"):
        decode_images(dense, np.array([0]))
    two_channels = held([column.row(0).tobytes()], (2, 5, 7))
    with pytest.raises(DataError, match=r"shape \(2, 5, 7\); it must be \(C, H, W\) with C 1"):
        decode_images(two_channels, np.array([0]))


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"crop_padding": -1}, "crop_padding must be >= 0, got -1"),
        ({"crop_padding": 1.5}, "crop_padding must be an integer >= 0, got 1.5"),
        ({"crop_padding": True}, "crop_padding must be an integer >= 0, got True"),
        ({"flip": 1}, "flip must be true or false, got 1"),
        ({"normalize": "yes"}, "normalize must be true or false, got 'yes'"),
    ],
)
def test_augmentation_fields_are_validated(fields: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Augmentation(**fields)  # type: ignore[arg-type]


def reference_augment(
    images: np.ndarray, padding: int, flip: bool, generator: np.random.Generator
) -> np.ndarray:
    """torchvision's RandomCrop(padding) then RandomHorizontalFlip, image by image."""
    count, _, height, width = images.shape
    offsets = generator.integers(0, 2 * padding + 1, size=(count, 2)) if padding else None
    flips = generator.random(count) < 0.5 if flip else np.zeros(count, dtype=bool)
    out = []
    for n in range(count):
        image = np.pad(images[n], ((0, 0), (padding, padding), (padding, padding)))
        top, left = offsets[n] if offsets is not None else (0, 0)
        window = image[:, top : top + height, left : left + width]
        out.append(window[:, :, ::-1] if flips[n] else window)
    return np.stack(out)


@pytest.mark.parametrize(("padding", "flip"), [(3, True), (2, False), (0, True), (9, True)])
def test_augment_matches_a_per_image_random_crop_and_flip(padding: int, flip: bool) -> None:
    images = np.random.default_rng(3).integers(1, 256, size=(16, 3, 6, 5), dtype=np.uint8)
    augmentation = Augmentation(crop_padding=padding, flip=flip)
    out = augment(images, augmentation, batch_seed(7, 1, 2, 3))
    expected = reference_augment(images, padding, flip, batch_seed(7, 1, 2, 3))
    assert out.dtype == np.uint8 and out.flags.c_contiguous
    np.testing.assert_array_equal(out, expected)
    assert out is not images and not np.shares_memory(out, images)
    if padding:  # some crops moved the image and brought zero padding in
        assert (out == 0).any() and not np.array_equal(out, images)


def test_augment_draws_and_padding_are_those_of_random_crop() -> None:
    images = np.full((200, 1, 4, 4), 9, dtype=np.uint8)
    out = augment(images, Augmentation(crop_padding=1), np.random.default_rng(5))
    offsets = np.random.default_rng(5).integers(0, 3, size=(200, 2))
    for n in range(200):
        top, left = offsets[n]
        visible = np.zeros((6, 6), dtype=bool)
        visible[1:5, 1:5] = True
        np.testing.assert_array_equal(out[n, 0] == 9, visible[top : top + 4, left : left + 4])
    assert {(int(t), int(left)) for t, left in offsets} == {
        (t, j) for t in range(3) for j in range(3)
    }


def test_flip_mirrors_about_half_of_the_images() -> None:
    images = np.random.default_rng(4).integers(0, 256, size=(64, 3, 2, 5), dtype=np.uint8)
    out = augment(images, Augmentation(flip=True), np.random.default_rng(0))
    flipped = np.array([np.array_equal(o, i[:, :, ::-1]) for o, i in zip(out, images, strict=True)])
    kept = np.array([np.array_equal(o, i) for o, i in zip(out, images, strict=True)])
    assert (flipped ^ kept).all()
    np.testing.assert_array_equal(flipped, np.random.default_rng(0).random(64) < 0.5)
    assert 16 < flipped.sum() < 48


def test_augment_without_crop_or_flip_returns_the_batch() -> None:
    images = np.zeros((2, 1, 3, 3), dtype=np.uint8)
    generator = np.random.default_rng(0)
    assert augment(images, Augmentation(), generator) is images
    assert generator.random() == np.random.default_rng(0).random()  # nothing drawn
    with pytest.raises(DataError, match=r"\(N, C, H, W\) batch of images, got shape \(3, 3\)"):
        augment(images[0, 0], Augmentation(flip=True), generator)


def test_batch_seed_is_the_augment_stream_of_the_batch_identity() -> None:
    expected = np.random.default_rng(np.random.SeedSequence((11, 2, 3, 4), spawn_key=(2,)))
    assert AUGMENT_STREAM == 2
    assert (
        batch_seed(11, 2, 3, 4).integers(1 << 62, size=4).tolist()
        == expected.integers(1 << 62, size=4).tolist()
    )
    draws = {
        tuple(batch_seed(*key).integers(1 << 62, size=2).tolist())
        for key in [(11, 2, 3, 4), (11, 2, 3, 5), (11, 2, 4, 4), (11, 3, 3, 4), (12, 2, 3, 4)]
    }
    assert len(draws) == 5
    assert batch_seed(2**64 - 1, 0, 0, 0).random() != batch_seed(0, 0, 0, 0).random()
    with pytest.raises(ConfigError, match="batch_seed batch must be an integer >= 0, got -1"):
        batch_seed(1, 0, 0, -1)
    with pytest.raises(ConfigError, match=r"batch_seed epoch must be an integer >= 0, got 1\.0"):
        batch_seed(1, 1.0, 0, 0)  # type: ignore[arg-type]


def test_batches_built_by_threads_in_any_order_are_bit_identical(
    rgb: tuple[HeldColumn, np.ndarray],
) -> None:
    column, _ = rgb
    augmentation = Augmentation(crop_padding=2, flip=True)
    batches = [np.array([0, 1, 2]), np.array([3, 4]), np.array([5, 0]), np.array([2, 2])]

    def build(batch: int) -> np.ndarray:
        images = decode_images(column, batches[batch])
        return augment(images, augmentation, batch_seed(5, 0, 1, batch))

    in_order = [build(b) for b in range(len(batches))]
    with ThreadPoolExecutor(3) as pool:
        reversed_order = list(pool.map(build, reversed(range(len(batches)))))[::-1]
    for a, b in zip(in_order, reversed_order, strict=True):
        np.testing.assert_array_equal(a, b)
    plain = [decode_images(column, rows) for rows in batches]
    assert any(not np.array_equal(a, b) for a, b in zip(in_order, plain, strict=True))


def test_normalization_reads_the_column_statistics() -> None:
    stats = {"mean": [0.5, 0.25, 0.125], "std": [0.2, 0.0, 0.1]}
    info = ColumnInfo("pixels", "uint8", (3, 4, 4), kind="image", statistics=stats)
    assert normalization(info, Augmentation()) == ((0.5, 0.25, 0.125), (0.2, 0.0, 0.1))
    assert normalization(info, Augmentation(normalize=False)) == (None, None)
    bare = ColumnInfo("pixels", "uint8", (3, 4, 4), kind="image")
    with pytest.raises(DataError, match="'pixels' has no per-channel mean and std"):
        normalization(bare, Augmentation())
    gray = ColumnInfo("pixels", "uint8", (1, 4, 4), kind="image", statistics=stats)
    with pytest.raises(
        DataError, match=r"3 means and 3 stds; normalize needs one of each per channel \(1\)"
    ):
        normalization(gray, Augmentation())


@pytest.mark.torch
def test_to_tensor_scales_and_normalizes_per_channel() -> None:
    import torch

    images = np.random.default_rng(6).integers(0, 256, size=(4, 3, 2, 3), dtype=np.uint8)
    scaled = to_tensor(images, None, None)
    assert scaled.dtype == torch.float32 and tuple(scaled.shape) == (4, 3, 2, 3)
    np.testing.assert_allclose(scaled.numpy(), images / 255.0, rtol=1e-6)
    mean, std = [0.5, 0.25, 0.125], [0.2, 0.0, 0.1]
    normalized = to_tensor(images, mean, std, pin=True)  # no CUDA here: pin is a no-op
    expected = (images / 255.0 - np.reshape(mean, (1, 3, 1, 1))) / np.reshape(
        [0.2, 1.0, 0.1], (1, 3, 1, 1)
    )
    np.testing.assert_allclose(normalized.numpy(), expected, rtol=1e-5, atol=1e-6)
    assert normalized.is_pinned() == torch.cuda.is_available()
    from_tensor = to_tensor(torch.from_numpy(images), mean, std)
    assert torch.equal(from_tensor, normalized)
    assert not np.shares_memory(scaled.numpy(), images)


@pytest.mark.torch
def test_to_tensor_refuses_mismatched_statistics() -> None:
    images = np.zeros((1, 3, 2, 2), dtype=np.uint8)
    with pytest.raises(DataError, match="got 1 means and 1 stds for 3 channels"):
        to_tensor(images, [0.5], [0.5])
    with pytest.raises(DataError, match="both mean and std"):
        to_tensor(images, [0.5] * 3, None)
    with pytest.raises(DataError, match=r"\(N, C, H, W\) batch, got shape \(3, 2, 2\)"):
        to_tensor(images[0], None, None)


@pytest.mark.torch
def test_decode_on_device_leaves_the_cpu_to_decode_images() -> None:
    import torch

    pixels = random_pixels(np.random.default_rng(7), 2, 4, 4, 3)
    column = held([encode(p, "JPEG") for p in pixels], (3, 4, 4), "jpeg")
    assert decode_on_device(column, np.arange(2), "cpu") is None
    assert decode_on_device(column, np.arange(2), torch.device("cpu")) is None
    if not torch.cuda.is_available():
        assert decode_on_device(column, np.arange(2), "cuda") is None
