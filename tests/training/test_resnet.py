"""ResNetSpec: torchvision's layout, training, pretrained weights, frozen stages, checks."""

from __future__ import annotations

import logging

import pytest
import torch

from cerebro_spark.data import ColumnInfo, DatasetInfo, FeatureStatistics
from cerebro_spark.errors import ConfigError
from cerebro_spark.training import ResNetSpec, Standardize, accepted_hyperparameters
from cerebro_spark.training._resnet import _split_uri

pytestmark = pytest.mark.torch

TINY = {"width": 0.125, "lr": 0.01}


@pytest.fixture(autouse=True)
def deterministic():
    previous = torch.are_deterministic_algorithms_enabled()
    torch.use_deterministic_algorithms(True)
    yield
    torch.use_deterministic_algorithms(previous)


def image_info(channels=3, side=16, classes=2, task="classification", name="img"):
    column = ColumnInfo(name, "uint8", (channels, side, side), kind="image", encoding="png")
    num_classes = classes if task == "classification" else None
    return DatasetInfo(column.shape, task, num_classes, features=(column,), dataset_id="t")


def build(params, info, seed=0):
    torch.manual_seed(seed)
    return ResNetSpec().build_model(params, info)


def halves(channels=3, side=16, rows=16, seed=0):
    """Class 0: the left half brighter; class 1: the right half (noisy, learnable)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.arange(rows) % 2
    images = torch.randn(rows, channels, side, side, generator=generator) * 0.5
    left = (labels == 0).view(-1, 1, 1, 1)
    images[..., : side // 2] += torch.where(left, 1.0, -1.0)
    images[..., side // 2 :] += torch.where(left, -1.0, 1.0)
    return images, labels


def train(model, params, info, inputs, labels, steps):
    spec = ResNetSpec()
    optimizer = spec.build_optimizer(model, params)
    model.train()
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = spec.loss(model(inputs), labels, info)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses


# Parameter counts are torchvision's (resnet18/34/50 docs: num_params at 1000 classes);
# state_dict sizes count every BatchNorm's 5 entries (num_batches_tracked included).
@pytest.mark.parametrize(
    ("depth", "num_params", "entries", "shapes"),
    [
        (
            18,
            11_689_512,
            122,
            {
                "conv1.weight": (64, 3, 7, 7),
                "layer1.1.conv2.weight": (64, 64, 3, 3),
                "layer2.0.downsample.0.weight": (128, 64, 1, 1),
                "layer2.0.downsample.1.running_var": (128,),
                "layer4.1.bn2.weight": (512,),
                "fc.weight": (1000, 512),
                "fc.bias": (1000,),
            },
        ),
        (
            34,
            21_797_672,
            218,
            {"layer3.5.conv2.weight": (256, 256, 3, 3), "layer4.2.bn2.bias": (512,)},
        ),
        (
            50,
            25_557_032,
            320,
            {
                "layer1.0.conv1.weight": (64, 64, 1, 1),
                "layer1.0.downsample.0.weight": (256, 64, 1, 1),
                "layer1.0.downsample.1.num_batches_tracked": (),
                "layer2.0.conv2.weight": (128, 128, 3, 3),
                "layer3.5.bn3.running_mean": (1024,),
                "layer4.2.conv3.weight": (2048, 512, 1, 1),
                "fc.weight": (1000, 2048),
            },
        ),
    ],
)
def test_torchvision_names_and_shapes(depth, num_params, entries, shapes):
    info = DatasetInfo((3, 224, 224), "classification", 1000)
    model = build({"depth": depth, "stem": "imagenet", "standardize": False}, info)
    state = model.state_dict()
    assert sum(p.numel() for p in model.parameters()) == num_params
    assert len(state) == entries
    assert {key: tuple(state[key].shape) for key in shapes} == shapes
    assert ("layer1.0.downsample.0.weight" in state) == (depth == 50)
    # torchvision's v1.5 bottleneck strides its 3x3 conv; a basic block its first conv.
    first = model.layer2[0]
    assert (first.conv2 if depth == 50 else first.conv1).stride == (2, 2)
    assert isinstance(model.maxpool, torch.nn.MaxPool2d)


@pytest.mark.parametrize(
    ("params", "channels"),
    [({"depth": 18}, 3), ({"depth": 34, "width": 0.0625}, 1), ({"depth": 50, "width": 0.0625}, 3)],
)
def test_trains_on_small_images_deterministically(params, channels):
    info = image_info(channels)
    inputs, labels = halves(channels)
    runs = [
        train(build({**TINY, **params}, info), {**TINY, **params}, info, inputs, labels, 6)
        for _ in range(2)
    ]
    assert runs[0] == runs[1]
    assert runs[0][-1] < 0.5 * runs[0][0], runs[0]


def test_stem_by_size_any_channels_and_regression():
    small = build(TINY, image_info(5, side=16, classes=3))
    assert small.conv1.kernel_size == (3, 3) and small.conv1.stride == (1, 1)
    assert isinstance(small.maxpool, torch.nn.Identity)
    assert small.eval()(torch.zeros(2, 5, 16, 16)).shape == (2, 3)
    large = build(TINY, image_info(1, side=72))
    assert large.conv1.kernel_size == (7, 7) and large.conv1.weight.shape[1] == 1
    assert build({**TINY, "stem": "small"}, image_info(1, side=72)).conv1.kernel_size == (3, 3)
    assert build({**TINY, "stem": "imagenet"}, image_info()).conv1.kernel_size == (7, 7)
    regression = build(TINY, image_info(task="regression")).eval()
    assert regression(torch.zeros(3, 3, 16, 16)).shape == (3, 1)
    assert build(TINY, image_info(), seed=4).state_dict().keys() == small.state_dict().keys()


def test_numeric_tensor_input_is_standardized_like_the_cnn():
    stats = FeatureStatistics(10, (5.0,) * 64, (2.0,) * 64, (0.0,) * 64, (9.0,) * 64)
    info = DatasetInfo((8, 8), "classification", 10, statistics=stats)
    model = build(TINY, info).eval()
    assert isinstance(model.input_norm, Standardize)
    assert model(torch.full((2, 8, 8), 5.0)).shape == (2, 10)
    assert model.conv1.weight.shape[1] == 1
    assert isinstance(build({**TINY, "standardize": False}, info).input_norm, torch.nn.Identity)


def test_dict_input_takes_the_named_image_column():
    columns = (
        ColumnInfo("a", "uint8", (3, 16, 16), kind="image"),
        ColumnInfo("b", "uint8", (1, 16, 16), kind="image"),
        ColumnInfo("n", "float32"),
    )
    info = DatasetInfo((), "classification", 2, features=columns, dataset_id="t")
    with pytest.raises(ConfigError, match="image_column"):
        build(TINY, info)
    with pytest.raises(ConfigError, match="image_column must name one of"):
        build({**TINY, "image_column": "n"}, info)
    model = build({**TINY, "image_column": "b"}, info).eval()
    batch = {"a": torch.rand(2, 3, 16, 16), "b": torch.rand(2, 1, 16, 16), "n": torch.rand(2)}
    out = model(batch)
    assert torch.equal(out, model({**batch, "a": torch.rand(2, 3, 16, 16), "n": torch.zeros(2)}))
    assert not torch.equal(out, model({**batch, "b": torch.rand(2, 1, 16, 16)}))
    only = DatasetInfo((), "classification", 2, features=columns[1:], dataset_id="t")
    assert build(TINY, only).image_column == "b"


def test_pretrained_round_trip_skips_fc_of_another_class_count(tmp_path, caplog):
    source = build(TINY, image_info(classes=10), seed=1)
    torch.save(source.state_dict(), tmp_path / "ten.pt")
    with caplog.at_level(logging.INFO, logger="cerebro_spark.training._resnet"):
        model = build({**TINY, "pretrained": str(tmp_path / "ten.pt")}, image_info(classes=5))
    [record] = [r for r in caplog.records if "skipped" in r.getMessage()]
    assert "fc.bias, fc.weight" in record.getMessage()
    fresh = build(TINY, image_info(classes=5)).state_dict()
    loaded, saved = model.state_dict(), source.state_dict()
    for key, value in loaded.items():
        if key.startswith("fc."):
            assert torch.equal(value, fresh[key]), key  # as built
        else:
            assert torch.equal(value, saved[key]), key
    assert loaded["fc.weight"].shape == (5, 512 // 8)
    # a file:// URI, a small stem's conv1 into an ImageNet stem, num_batches_tracked absent
    state = {k: v for k, v in saved.items() if not k.endswith("num_batches_tracked")}
    torch.save(state, tmp_path / "old.pt")
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="cerebro_spark.training._resnet"):
        other = build(
            {**TINY, "stem": "imagenet", "pretrained": f"file://{tmp_path}/old.pt"},
            image_info(classes=10),
        )
    assert "skipped 1 keys" in caplog.text and "conv1.weight" in caplog.text
    assert torch.equal(other.layer4[1].conv2.weight, source.layer4[1].conv2.weight)
    assert other.conv1.weight.shape == (8, 3, 7, 7)


def test_pretrained_errors_name_the_keys(tmp_path):
    state = build(TINY, image_info()).state_dict()
    torch.save({**state, "head.weight": torch.zeros(2)}, tmp_path / "extra.pt")
    missing = {k: v for k, v in state.items() if k != "layer1.0.conv1.weight"}
    torch.save(missing, tmp_path / "missing.pt")
    torch.save([1, 2], tmp_path / "list.pt")
    (tmp_path / "junk.pt").write_bytes(b"not a zip")
    cases = {
        "extra.pt": "unexpected keys \\['head.weight'\\]",
        "missing.pt": "missing keys \\['layer1.0.conv1.weight'\\]",
        "list.pt": "must hold a state_dict",
        "junk.pt": "is not a state_dict saved with torch.save",
        "absent.pt": "does not exist",
    }
    for name, message in cases.items():
        with pytest.raises(ConfigError, match=f"pretrained .*{message}"):
            build({**TINY, "pretrained": str(tmp_path / name)}, image_info())
    with pytest.raises(ConfigError, match=r"missing keys .*layer1\.0\.conv3"):
        build({**TINY, "depth": 50, "pretrained": str(tmp_path / "extra.pt")}, image_info())


def test_split_uri_keeps_scheme_and_options():
    assert _split_uri("s3://bucket/dir/w.pt?region=x") == ("s3://bucket/dir?region=x", "w.pt")
    assert _split_uri("s3://bucket/w.pt") == ("s3://bucket", "w.pt")
    assert _split_uri("/tmp/a/w.pt") == ("/tmp/a", "w.pt")
    assert _split_uri("w.pt") == (".", "w.pt")
    with pytest.raises(ConfigError, match="pretrained must be the URI of a file"):
        _split_uri("s3://bucket/dir/")


def test_frozen_stages_keep_weights_and_batchnorm_statistics():
    info = image_info()
    params = {**TINY, "freeze": 2, "optimizer": "sgd", "momentum": 0.9, "weight_decay": 0.1}
    model = build(params, info)
    frozen = [model.conv1, model.bn1, model.layer1]
    model.train()
    assert model.training and model.layer2[0].bn1.training
    assert not model.bn1.training and not model.layer1[1].bn2.training
    assert not any(p.requires_grad for m in frozen for p in m.parameters())
    assert all(p.requires_grad for p in model.layer2.parameters())
    before = {k: v.clone() for k, v in model.state_dict().items()}
    inputs, labels = halves()
    train(model, params, info, inputs, labels, 2)
    after = model.state_dict()
    for key in before:
        changed = not torch.equal(before[key], after[key])
        assert changed != key.startswith(("conv1.", "bn1.", "layer1.")), key
    model.eval()
    assert not model.training and not model.layer2[0].bn1.training and not model.bn1.training


def test_zero_init_residual_zeroes_each_blocks_last_batchnorm():
    model = build({**TINY, "depth": 50, "zero_init_residual": True}, image_info())
    assert all(
        not block.bn3.weight.any() for layer in (model.layer1, model.layer4) for block in layer
    )
    assert model.bn1.weight.all()
    basic = build({**TINY, "zero_init_residual": True}, image_info())
    assert not basic.layer2[1].bn2.weight.any() and basic.layer2[1].bn1.weight.all()
    assert build(TINY, image_info()).layer2[1].bn2.weight.all()


@pytest.mark.parametrize(
    ("params", "name"),
    [
        ({"depth": 101}, "depth must be one of \\[18, 34, 50\\]"),
        ({"depth": True}, "depth"),
        ({"width": 0}, "width must be a float > 0"),
        ({"width": "wide"}, "width"),
        ({"stem": "tiny"}, "stem must be one of"),
        ({"freeze": 6}, "freeze must be an int in \\[0, 5\\]"),
        ({"freeze": -1}, "freeze must be an int >= 0"),
        ({"zero_init_residual": 1}, "zero_init_residual must be true or false"),
        ({"pretrained": ""}, "pretrained must be a URI"),
        ({"image_column": "img2"}, "image_column must name one of"),
        ({"dropout": 1.0}, "dropout"),
        ({"standardize": "no"}, "standardize"),
    ],
)
def test_params_are_checked(params, name):
    with pytest.raises(ConfigError, match=name):
        ResNetSpec().check_params({**TINY, **params}, image_info())


def test_declared_hyperparameters_and_bad_datasets():
    declared = accepted_hyperparameters(ResNetSpec)
    assert {"depth", "width", "stem", "pretrained", "freeze", "zero_init_residual"} <= declared
    assert {"image_column", "dropout", "lr", "optimizer"} <= declared
    with pytest.raises(ConfigError, match="feature_shape \\(C, H, W\\) or \\(H, W\\)"):
        build(TINY, DatasetInfo((10,), "classification", 2))
    sequence = ColumnInfo("s", "int32", kind="sequence", cardinality=5, max_length=4)
    info = DatasetInfo((), "classification", 2, features=(sequence,), dataset_id="t")
    with pytest.raises(ConfigError, match="one image column"):
        build(TINY, info)
