"""Catalogue: bad input is refused before anything is written or started (issue 12, part 4).

Each case is an input a new user could give, the exact one-line error expected (exit
status 2, no traceback) and a check that nothing was written: no ``config.json``, the id
still free (a good run with it then succeeds where that is cheap to show), an existing
experiment's files unchanged. The last cases are about credentials (part 5): redacted in
``config.json``, ``events.jsonl`` and the logs, and given back to ``resume`` by the config
file.
"""

from __future__ import annotations

import json
import logging
from pathlib import Path

import pytest

from cerebro_spark.cli import main
from cerebro_spark.errors import ConfigError

GOOD = """\
name: demo
data: {source: "sklearn:digits", partitions: 2}
model: cerebro_spark.training:MLPSpec
epochs: 1
workers: 2
space: {hidden_units: {grid: [[16]]}, lr: 0.01}
"""


def _cli(argv: list[str], caplog: pytest.LogCaptureFixture) -> tuple[int, list[str]]:
    """Run the CLI; return its exit status and its ERROR lines."""
    caplog.clear()
    with caplog.at_level(logging.INFO):
        code = main(argv)
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert not any("Traceback" in line for line in caplog.text.splitlines()), caplog.text
    return code, errors


def _nothing_written(store: Path) -> None:
    assert not list(store.rglob("config.json")) if store.exists() else True
    assert not (store / "experiments").exists(), sorted(store.rglob("*"))


def _config(tmp_path: Path, text: str = GOOD, name: str = "c.yaml") -> str:
    path = tmp_path / name
    path.write_text(text)
    return str(path)


# -- refused before anything is written ---------------------------------------------------

CASES = {
    # id: (change to the GOOD config or None, extra argv, the exact error)
    "workers-0": (None, ["--workers", "0"], "--workers 0: workers must be an int ≥ 1, got 0"),
    "seed-negative": (None, ["--seed", "-5"], "--seed -5: seed must be an int ≥ 0, got -5"),
    "device-unknown": (
        None,
        ["--device", "gpu"],
        "--device gpu: device must be 'auto', 'cpu', 'cuda' or 'cuda:N' (N a GPU index), got 'gpu'",
    ),
    "device-pinned-on-spark": (
        ("workers: 2", "workers: 2\nbackend: spark\ndevice: cuda:0"),
        [],
        "device 'cuda:0' pins every worker to one GPU, which Spark does not schedule",
    ),
    "hyperparameter-typo": (
        ("hidden_units", "hiden_units"),
        [],
        "space.hiden_units: model spec 'cerebro_spark.training:MLPSpec' has no hyperparameter "
        "'hiden_units' (did you mean 'hidden_units'?); it accepts: activation, batch_size, "
        "dropout, hidden_units, lr, lr_cosine_epochs, lr_schedule, lr_step_gamma, lr_step_size, "
        "momentum, optimizer, standardize, validation_batch_size, weight_decay",
    ),
    "procedure-option-typo": (
        ("epochs: 1", "epochs: 1\nprocedure: {name: random, num_trails: 2}"),
        [],
        "search procedure 'random' has no option 'num_trails'; accepted options: max_concurrent, "
        "num_trials",
    ),
    "procedure-option-value": (
        ("epochs: 1", "epochs: 1\nprocedure: {name: random, num_trials: 0}"),
        [],
        "search procedure 'random' rejects its options {'num_trials': 0}: num_trials must be "
        "an integer >= 1, got 0",
    ),
    "space-bad-bound": (
        ("lr: 0.01", "lr: {loguniform: [0, 1]}"),
        [],
        "space.lr: loguniform low must be > 0, got 0",
    ),
    "dotdot-id": (
        None,
        ["--experiment-id", "../x"],
        "--experiment-id must be letters, digits, '-', '_' or '.' (no '..'), got '../x'",
    ),
    "slash-id": (
        None,
        ["--experiment-id", "a/b"],
        "--experiment-id must be letters, digits, '-', '_' or '.' (no '..'), got 'a/b'",
    ),
    "dotdot-name": (
        ("name: demo", "name: a..b"),
        [],
        "name must be letters, digits, '-', '_' or '.' (no '..'), got 'a..b'",
    ),
    "duplicate-yaml-key": (
        ("epochs: 1", "epochs: 1\nepochs: 2"),
        [],
        "found duplicate key 'epochs'",
    ),
    "missing-source": (
        ('"sklearn:digits"', '"/nonexistent/data.parquet"'),
        [],
        "data.source '/nonexistent/data.parquet' does not exist (no file or folder at "
        "/nonexistent/data.parquet)",
    ),
    "worker-memory-flag": (
        None,
        ["--worker-memory", "12x"],
        "--worker-memory 12x: worker_memory must be a number of bytes (an int ≥ 1) or a size "
        "such as '4GiB', '512MiB' or '2g', got '12x'",
    ),
    "kind-for-no-feature": (
        ("partitions: 2}", "partitions: 2, categorical: [nope]}"),
        [],
        "'nope' named as image, categorical or sequence columns but not among the features (image)",
    ),
    "image-size-zero": (
        ("partitions: 2}", "partitions: 2, image_size: [0, 32]}"),
        [],
        "data: image_size must be an integer >= 1, got 0",
    ),
    "hash-buckets-negative": (
        ("partitions: 2}", "partitions: 2, hash_buckets: -3}"),
        [],
        "data: hash_buckets must be an integer >= 0, got -3",
    ),
    "spec-not-importable": (
        ("cerebro_spark.training:MLPSpec", "nope.models:Spec"),
        [],
        "spec 'nope.models:Spec': cannot import module 'nope.models'",
    ),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_refused_before_anything_is_written(case, tmp_path, caplog):
    change, extra, expected = CASES[case]
    text = GOOD if change is None else GOOD.replace(*change)
    store = tmp_path / "store"
    code, errors = _cli(["run", _config(tmp_path, text), "--store", str(store), *extra], caplog)
    assert code == 2
    assert len(errors) == 1, errors
    assert expected in errors[0], errors[0]
    _nothing_written(store)


CONF = Path(__file__).resolve().parents[2] / "conf"
ELASTIC = f"""\
{GOOD}deadline: 60
elastic:
  manager: standalone
  prices: {CONF / "prices/local.yaml"}
  instance_type: local-core
  profile: {CONF / "profiles/digits-local.yaml"}
  standalone: {{cores: 1, memory: 1g, max_executors: 2}}
"""

# Refused on Spark and elastic runs (issue 29, part 3): each once let the id be taken.
ELASTIC_CASES = {
    # id: (change to the ELASTIC config, the exact error (its start, where it goes on))
    "prices-missing": (
        (str(CONF / "prices/local.yaml"), "/nope/prices.yaml"),
        "price catalog /nope/prices.yaml does not exist",
    ),
    "profile-missing": (
        (str(CONF / "profiles/digits-local.yaml"), "/nope/profile.yaml"),
        "profile /nope/profile.yaml does not exist",
    ),
    "instance-type-unpriced": (
        ("instance_type: local-core", "instance_type: m9.huge"),
        f"price catalog {CONF / 'prices/local.yaml'} has no instance type 'm9.huge'; it lists "
        "['local-core']",
    ),
    "max-executors-0": (
        ("max_executors: 2", "max_executors: 0"),
        "elastic.standalone.max_executors must be an integer >= 1, got 0",
    ),
    "deadline-infeasible": (  # 16 s to start a worker (the profile), or the pre-flight
        ("deadline: 60", "deadline: 10"),  # took it all on a loaded machine: both refuse
        "deadline 10 s ",
    ),
    "plan-missing": (
        ("  standalone:", "  plan: /nope/plan.json\n  standalone:"),
        "elastic.plan /nope/plan.json cannot be read as JSON",
    ),
    "spark-speculation": (
        ("workers: 2", "workers: 2\nspark: {conf: {spark.speculation: 'true'}}"),
        "spark.speculation=true is not supported by SparkBackend",
    ),
    "elastic-on-local": (
        ("workers: 2", "workers: 2\nbackend: local"),
        "elastic: plans and resizes a Spark cluster, but backend is 'local'",
    ),
}


@pytest.mark.parametrize("case", sorted(ELASTIC_CASES))
def test_elastic_and_spark_settings_are_refused_before_anything_is_written(case, tmp_path, caplog):
    change, expected = ELASTIC_CASES[case]
    assert change[0] in ELASTIC, change
    store = tmp_path / "store"
    argv = ["run", _config(tmp_path, ELASTIC.replace(*change)), "--store", str(store)]
    code, errors = _cli([*argv, "--experiment-id", "e1"], caplog)
    assert code == 2 and len(errors) == 1, errors
    assert expected in errors[0], errors[0]
    _nothing_written(store)


def test_the_id_an_elastic_refusal_left_free_runs_without_it(tmp_path, caplog):
    store = tmp_path / "store"
    bad = ELASTIC.replace(str(CONF / "prices/local.yaml"), "/nope/prices.yaml")
    argv = ["--store", str(store), "--experiment-id", "e1"]
    assert _cli(["run", _config(tmp_path, bad, "bad.yaml"), *argv], caplog)[0] == 2
    assert _cli(["run", _config(tmp_path), *argv], caplog) == (0, [])
    assert (store / "experiments" / "e1" / "best.pt").exists()


def _image_source(tmp_path: Path, images: list[bytes]) -> str:
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = tmp_path / "images.parquet"
    labels = [i % 2 for i in range(len(images))]
    pq.write_table(pa.table({"image": pa.array(images, pa.binary()), "label": labels}), path)
    return str(path)


def _pngs(rows: int, sizes: dict[int, int]) -> list[bytes]:
    import io

    import numpy as np
    from PIL import Image

    out = []
    for row in range(rows):
        side = sizes.get(row, 8)
        buffer = io.BytesIO()
        Image.fromarray(np.full((side, side), row, np.uint8), mode="L").save(buffer, "PNG")
        out.append(buffer.getvalue())
    return out


@pytest.mark.parametrize(
    ("damage", "expected"),
    [
        ("truncated", "image column 'image' row 5"),
        ("sizes", "8x8 first seen at row 0 and 9x9 first seen at row 7"),
    ],
)
def test_images_that_cannot_be_prepared_are_refused_by_column_and_row(
    damage, expected, tmp_path, caplog
):
    images = _pngs(20, {7: 9} if damage == "sizes" else {})
    if damage == "truncated":
        images[5] = images[5][:30]
    source = _image_source(tmp_path, images)
    text = GOOD.replace('"sklearn:digits"', json.dumps(source))
    store = tmp_path / "store"
    code, errors = _cli(["run", _config(tmp_path, text), "--store", str(store)], caplog)
    assert code == 2 and len(errors) == 1, errors
    assert expected in errors[0], errors[0]
    _nothing_written(store)
    datasets = store / "datasets"
    assert not datasets.exists() or not any(datasets.rglob("*.parquet"))


def test_store_under_a_regular_file_is_refused(tmp_path, caplog):
    (tmp_path / "afile").write_text("not a directory")
    store = tmp_path / "afile" / "store"
    code, errors = _cli(["run", _config(tmp_path), "--store", str(store)], caplog)
    assert (code, errors) == (
        2,
        [
            f"store {store} is under {tmp_path / 'afile'}, which is a regular file: a store "
            "must be a directory (or a path where one can be created)"
        ],
    )
    assert (tmp_path / "afile").read_text() == "not a directory"


def test_read_only_store_is_refused(tmp_path, caplog):
    """/sys is mounted read-only (also for root, whom permission bits do not stop)."""
    probe = Path("/sys/cerebro-probe")
    try:
        probe.mkdir()
    except OSError:
        pass
    else:  # pragma: no cover - a writable /sys: nothing to show here
        probe.rmdir()
        pytest.skip("/sys is writable on this machine")
    code, errors = _cli(["run", _config(tmp_path), "--store", "/sys/cerebro-store"], caplog)
    assert code == 2
    assert errors[0].startswith(
        "store /sys/cerebro-store is not writable: cannot create a directory in /sys ("
    ), errors
    assert not probe.exists()


def test_missing_config_file(tmp_path, caplog):
    code, errors = _cli(["run", str(tmp_path / "nope.yaml")], caplog)
    assert (code, errors) == (2, [f"config file {tmp_path / 'nope.yaml'} does not exist"])


def test_debug_adds_the_traceback(tmp_path, caplog):
    caplog.clear()
    assert main(["--debug", "run", str(tmp_path / "nope.yaml")]) == 2
    (record,) = [r for r in caplog.records if r.levelno >= logging.ERROR]
    assert record.getMessage() == f"config file {tmp_path / 'nope.yaml'} does not exist"
    assert record.exc_info is not None and "Traceback" in caplog.text


def test_bad_lease_timeout_is_refused_before_the_data_is_prepared(tmp_path, caplog, monkeypatch):
    monkeypatch.setenv("CEREBRO_LEASE_TIMEOUT_SECONDS", "soon")
    store = tmp_path / "store"
    code, errors = _cli(["run", _config(tmp_path), "--store", str(store)], caplog)
    assert (code, errors) == (
        2,
        ["CEREBRO_LEASE_TIMEOUT_SECONDS must be a number of seconds > 0, got 'soon'"],
    )
    assert not store.exists()  # not even the dataset


def _fake_experiment(store: Path, experiment_id: str, config: dict) -> dict[str, bytes]:
    """An existing experiment's files (as a run leaves them), returned to compare later."""
    folder = store / "experiments" / experiment_id
    folder.mkdir(parents=True)
    (folder / "config.json").write_text(json.dumps(config))
    (folder / "events.jsonl").write_text('{"event": "experiment_start", "time": 0}\n')
    return {p.name: p.read_bytes() for p in folder.iterdir()}


def test_run_with_an_existing_id_leaves_it_untouched(tmp_path, caplog):
    store = tmp_path / "store"
    before = _fake_experiment(store, "e1", {"name": "demo"})
    code, errors = _cli(
        ["run", _config(tmp_path), "--store", str(store), "--experiment-id", "e1"], caplog
    )
    assert (code, errors) == (
        2,
        [
            f"experiment e1 already exists in {store}; use 'cerebro-spark resume' to continue "
            "it or pick another id"
        ],
    )
    folder = store / "experiments" / "e1"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before
    assert not (store / "datasets").exists()


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["resume", "nope"], "no experiment 'nope' in {store} (missing "
                             "experiments/nope/config.json)"),
        (["resume", "../x"], "experiment id must be letters, digits, '-', '_' or '.' (no '..'), "
                             "got '../x'"),
        (["leaderboard", "nope"], "no experiment 'nope' in {store} (missing "
                                  "experiments/nope/config.json)"),
        (["replay", "nope", "--workers", "0"], "--workers must be an int ≥ 1, got 0"),
        (["leaderboard", "nope", "--limit", "0"], "--limit must be an int ≥ 1, got 0"),
        (["replay", "nope"], "no experiment 'nope' in {store} (missing "
                             "experiments/nope/config.json)"),
    ],
    ids=["resume-missing", "resume-dotdot", "leaderboard-missing", "replay-workers-0",
         "leaderboard-limit-0", "replay-missing"],
)  # fmt: skip
def test_commands_on_a_bad_experiment_reference(argv, expected, tmp_path, caplog):
    store = tmp_path / "store"
    code, errors = _cli([*argv, "--store", str(store)], caplog)
    assert (code, errors) == (2, [expected.format(store=store)])
    _nothing_written(store)


def test_api_refuses_a_config_changed_in_code(tmp_path):
    from cerebro_spark.engine import load_config, run_experiment

    config = load_config(_config(tmp_path)).replace(store=str(tmp_path / "store"), epochs=0)
    with pytest.raises(ConfigError, match=r"^epochs must be an int ≥ 1, got 0$"):
        run_experiment(config)
    _nothing_written(tmp_path / "store")


def test_undeclared_spec_is_not_checked_and_declared_one_is(tmp_path):
    """A spec without its own ``hyperparameters`` accepts any param; a declared one refuses
    others, in every branch of a choice of sub-spaces."""
    from cerebro_spark.driver._preflight import check_hyperparameters
    from cerebro_spark.engine import load_config

    (tmp_path / "myspecs.py").write_text(
        "from cerebro_spark.training import MLPSpec\n"
        "class Free(MLPSpec):\n    pass  # inherits no declaration: may read more\n"
        "class Strict(MLPSpec):\n    hyperparameters = {'hidden_units'}\n"
    )
    text = GOOD.replace("cerebro_spark.training:MLPSpec", "myspecs:Free").replace(
        "lr: 0.01", "lr: 0.01, anything: 3"
    )
    check_hyperparameters(load_config(_config(tmp_path, text)))
    strict = text.replace("myspecs:Free", "myspecs:Strict")
    with pytest.raises(ConfigError, match="'myspecs:Strict' has no hyperparameter 'anything'"):
        check_hyperparameters(load_config(_config(tmp_path, strict, "s.yaml")))
    branches = GOOD.replace(
        "space: {hidden_units: {grid: [[16]]}, lr: 0.01}",
        "space:\n  choice:\n    - {model: 'myspecs:Free', anything: 1}\n"
        "    - {model: 'myspecs:Strict', hidden_unit: [8]}",
    )
    with pytest.raises(ConfigError, match=r"hidden_unit.*did you mean 'hidden_units'"):
        check_hyperparameters(load_config(_config(tmp_path, branches, "b.yaml")))


# -- secrets ------------------------------------------------------------------------------


def test_resume_without_the_redacted_credential_names_it(tmp_path, caplog):
    store = tmp_path / "store"
    config = {
        "name": "demo",
        "data": {"source": "sklearn:digits"},
        "space": {},
        "spark": {"conf": {"spark.hadoop.fs.s3a.secret.key": "<redacted>"}},
    }
    before = _fake_experiment(store, "e1", config)
    code, errors = _cli(["resume", "e1", "--store", str(store)], caplog)
    assert (code, errors) == (
        2,
        [
            "experiment e1: the stored config does not hold "
            "spark.conf.spark.hadoop.fs.s3a.secret.key (a credential, redacted when stored); "
            "pass the config the experiment was started with: --config FILE on the command "
            "line, secrets=load_config(FILE) in Python"
        ],
    )
    folder = store / "experiments" / "e1"
    assert {p.name: p.read_bytes() for p in folder.iterdir()} == before


def test_redaction_rules():
    from cerebro_spark._redact import REDACTED, SecretFilter, is_secret_key, redact, redact_uri

    secret_keys = [
        "spark.hadoop.fs.s3a.secret.key",
        "spark.hadoop.fs.s3a.access.key",
        "spark.authenticate.secret",
        "spark.ssl.keyPassword",
        "spark.kubernetes.authenticate.submission.oauthToken",
        "AWS_SECRET_ACCESS_KEY",
        "AWS_SESSION_TOKEN",
        "fs.azure.account.key.credentials",
        "api_key",
    ]
    plain = ["spark.executor.memory", "spark.authenticate", "PWD", "max_tokens_per_batch_x"]
    assert all(is_secret_key(k) for k in secret_keys)
    assert not any(is_secret_key(k) for k in plain[:3])
    assert redact_uri("http://user:pw@host:5000/x") == f"http://user:{REDACTED}@host:5000/x"
    assert redact_uri("s3://b/p?secret_key=abc&region=eu") == (
        f"s3://b/p?secret_key={REDACTED}&region=eu"
    )
    document = {
        "space": {"token_budget": 5},  # the space is the experiment, never redacted
        "spark": {"conf": {"spark.authenticate.secret": "s3cr3t!", "spark.executor.memory": "1g"}},
        "elastic": {"manager": "databricks", "databricks": {"token": "dapi123456"}},
        "store": "s3://b/p?access_key=AK&secret_key=SK",
    }
    assert redact(document) == {
        "space": {"token_budget": 5},
        "spark": {"conf": {"spark.authenticate.secret": REDACTED, "spark.executor.memory": "1g"}},
        "elastic": {"manager": "databricks", "databricks": {"token": REDACTED}},
        "store": f"s3://b/p?access_key={REDACTED}&secret_key={REDACTED}",
    }
    record = logging.LogRecord("x", logging.INFO, "f", 1, "key %s at %s", ("AKIA-S3CR3T-X",
                               "s3://b?secret_key=zzz"), None)  # fmt: skip
    SecretFilter({"AWS_SECRET_ACCESS_KEY": "AKIA-S3CR3T-X"}).filter(record)
    assert record.getMessage() == f"key {REDACTED} at s3://b?secret_key={REDACTED}"


SECRET = "TOPSECRET-s3a-0123456789"


@pytest.mark.torch
@pytest.mark.slow
def test_credentials_in_spark_conf_never_reach_the_store_and_resume_takes_them_back(
    tmp_path, caplog
):
    store = tmp_path / "store"
    text = GOOD + (
        f"spark:\n  conf: {{spark.hadoop.fs.s3a.secret.key: {SECRET}, spark.executor.memory: 1g}}\n"
    )
    config = _config(tmp_path, text)
    argv = ["run", config, "--store", str(store), "--experiment-id", "e1"]
    code, errors = _cli([*argv, "--workers", "0"], caplog)
    assert (code, errors) == (2, ["--workers 0: workers must be an int ≥ 1, got 0"])
    code, errors = _cli(argv, caplog)  # the refused start left e1 free
    assert (code, errors) == (0, [])
    assert SECRET not in caplog.text
    for file in store.rglob("*"):
        if file.is_file():
            assert SECRET.encode() not in file.read_bytes(), file
    folder = store / "experiments" / "e1"
    stored = json.loads((folder / "config.json").read_text())
    assert stored["spark"]["conf"] == {
        "spark.hadoop.fs.s3a.secret.key": "<redacted>",
        "spark.executor.memory": "1g",
    }
    start = json.loads((folder / "events.jsonl").read_text().splitlines()[0])
    assert start["config"]["spark"]["conf"]["spark.hadoop.fs.s3a.secret.key"] == "<redacted>"
    log_before = (folder / "events.jsonl").read_bytes()
    code, errors = _cli(["resume", "e1", "--store", str(store)], caplog)
    assert code == 2 and "spark.conf.spark.hadoop.fs.s3a.secret.key" in errors[0]
    assert (folder / "events.jsonl").read_bytes() == log_before
    code, errors = _cli(["resume", "e1", "--store", str(store), "--config", config], caplog)
    assert (code, errors) == (0, [])  # finished: nothing to run, but the config resolved
    assert SECRET not in caplog.text
    code, errors = _cli(["leaderboard", "e1", "--store", str(store)], caplog)
    assert (code, errors) == (0, [])  # reading results needs no credential
