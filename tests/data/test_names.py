"""Dataset names: the store's registry, resolution of name / id / URI, and the CLI."""

from __future__ import annotations

import json
import logging
from pathlib import Path
from typing import Any

import pytest

from cerebro_spark.cli import main
from cerebro_spark.data import load_source, prepare_dataset
from cerebro_spark.data._names import (
    NAMES_PREFIX,
    check_dataset_name,
    dataset_names,
    find_dataset,
    list_datasets,
    name_dataset,
    read_dataset_name,
    remove_dataset_name,
)
from cerebro_spark.errors import DataError
from cerebro_spark.store import open_store


def prepared(store: str, name: str = "sklearn:iris", partitions: int = 2) -> Any:
    table, meta = load_source(name)
    return prepare_dataset(table, store, num_partitions=partitions, seed=0, **meta)


@pytest.mark.parametrize("name", ["churn-2026-11", "a", "A.b_c-9", "x" * 128, "v1.2"])
def test_good_names(name: str) -> None:
    assert check_dataset_name(name) == name


@pytest.mark.parametrize(
    "name", ["", "-lead", ".hidden", "_x", "a b", "a/b", "a..b", "x" * 129, "é", None, 7]
)
def test_bad_names_are_refused_naming_the_rule(name: Any) -> None:
    with pytest.raises(DataError, match=r"breaks the rule \[A-Za-z0-9\]") as error:
        check_dataset_name(name)
    assert repr(name) in str(error.value)


def test_a_name_cannot_look_like_a_dataset_id() -> None:
    with pytest.raises(DataError, match="looks like a dataset id"):
        check_dataset_name("0123456789abcdef01234567")


def test_name_resolve_rename_and_forget(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    store = str(tmp_path / "runs")
    iris, wine = prepared(store), prepared(store, "sklearn:wine")
    record = name_dataset(store, "flowers", iris)
    assert (record.dataset_id, dict(record.rows)) == (
        iris.dataset_id,
        {"train": 120, "validation": 30},
    )
    key = f"{NAMES_PREFIX}/flowers.json"
    stored = json.loads(open_store(store).get(key))
    assert stored["dataset_id"] == iris.dataset_id and stored["name"] == "flowers"
    assert name_dataset(store, "flowers", iris.dataset_id) == record  # same dataset: kept

    uri = open_store(store).url(f"datasets/{iris.dataset_id}")
    assert find_dataset(store, "flowers") == uri
    assert find_dataset(store, iris.dataset_id) == uri
    assert find_dataset(store, uri) == uri  # a URI is taken as it is
    assert find_dataset(str(tmp_path / "elsewhere"), uri) == uri

    with pytest.raises(DataError, match="already points at dataset") as error:
        name_dataset(store, "flowers", wine)
    assert iris.dataset_id in str(error.value) and "--force" in str(error.value)
    assert read_dataset_name(store, "flowers").dataset_id == iris.dataset_id  # unchanged

    caplog.set_level(logging.WARNING, logger="cerebro_spark.data")
    name_dataset(store, "flowers", wine, overwrite=True)
    assert find_dataset(store, "flowers") == open_store(store).url(f"datasets/{wine.dataset_id}")
    assert f"pointed at {iris.dataset_id}; it now points at {wine.dataset_id}" in caplog.text

    assert remove_dataset_name(store, "flowers").dataset_id == wine.dataset_id
    assert dataset_names(store) == []
    with pytest.raises(DataError, match="no dataset name 'flowers'"):
        find_dataset(store, "flowers")


def test_unknown_references_list_the_names(tmp_path: Path) -> None:
    store = str(tmp_path)
    iris = prepared(store)
    name_dataset(store, "iris-1", iris)
    name_dataset(store, "iris-2", iris)
    with pytest.raises(DataError, match="no dataset name 'irs'") as error:
        find_dataset(store, "irs")
    assert "names there: iris-1, iris-2" in str(error.value)
    assert "cerebro-spark datasets --store" in str(error.value)
    with pytest.raises(DataError, match="no dataset id '0123456789abcdef01234567'"):
        find_dataset(store, "0123456789abcdef01234567")
    with pytest.raises(DataError, match="no prepared dataset 0123456789abcdef01234567"):
        name_dataset(store, "ghost", "0123456789abcdef01234567")


def test_a_name_of_a_removed_dataset_says_so(tmp_path: Path) -> None:
    store = str(tmp_path)
    iris = prepared(store)
    name_dataset(store, "iris", iris)
    open_store(store).delete(f"datasets/{iris.dataset_id}/manifest.json")
    with pytest.raises(DataError, match=f"points at dataset {iris.dataset_id}, which is no longer"):
        find_dataset(store, "iris")


def test_a_relative_dataset_directory_still_works(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Before names, ``dataset: mydata`` meant a directory; it still does where no name is."""
    iris = prepared(str(tmp_path / "runs"))
    monkeypatch.chdir(tmp_path / "runs" / "datasets")
    assert find_dataset(str(tmp_path / "other"), iris.dataset_id) == str(
        tmp_path / "runs" / "datasets" / iris.dataset_id
    )


def test_list_datasets_with_names_rows_and_time(tmp_path: Path) -> None:
    store = str(tmp_path)
    iris, wine = prepared(store), prepared(store, "sklearn:wine", partitions=3)
    name_dataset(store, "b-iris", iris)
    name_dataset(store, "a-iris", iris)
    entries = {entry.dataset_id: entry for entry in list_datasets(store)}
    assert set(entries) == {iris.dataset_id, wine.dataset_id}
    assert entries[iris.dataset_id].names == ("a-iris", "b-iris")
    assert entries[wine.dataset_id].names == ()
    assert entries[wine.dataset_id].num_partitions == 3
    assert dict(entries[wine.dataset_id].rows) == {"train": 142, "validation": 36}
    assert entries[iris.dataset_id].created is not None
    assert entries[iris.dataset_id].source == "sklearn:iris"


def test_names_on_s3(s3_server: Any) -> None:
    store = s3_server.uri("lake")
    iris = prepared(store)
    name_dataset(store, "churn-2026-11", iris)
    assert find_dataset(store, "churn-2026-11") == open_store(store).url(
        f"datasets/{iris.dataset_id}"
    )
    (entry,) = list_datasets(store)
    assert entry.names == ("churn-2026-11",)
    keys = {
        o["Key"] for o in s3_server.client().list_objects_v2(Bucket=s3_server.bucket)["Contents"]
    }
    assert "lake/datasets/_names/churn-2026-11.json" in keys
    with pytest.raises(DataError, match="already points at"):
        name_dataset(store, "churn-2026-11", prepared(store, "sklearn:wine"))


# -- the command line -----------------------------------------------------------------------


def test_prepare_name_and_the_datasets_command(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path / "runs")
    base = ["prepare", "--engine", "python", "--store", store, "--partitions", "2"]
    assert main([*base, "--input", "sklearn:iris", "--name", "churn-2026-11"]) == 0
    out = capsys.readouterr().out
    assert "(named churn-2026-11)" in out
    iris_id = out.split()[1]
    assert read_dataset_name(store, "churn-2026-11").dataset_id == iris_id

    assert main([*base, "--input", "sklearn:wine", "--name", "churn-2026-11"]) == 2
    assert f"already points at dataset {iris_id}" in caplog.text
    assert "is prepared at" in caplog.text  # the data was prepared, only not named
    assert main([*base, "--input", "sklearn:wine", "--name", "churn-2026-11", "--force"]) == 0
    wine_id = capsys.readouterr().out.split()[1]
    assert read_dataset_name(store, "churn-2026-11").dataset_id == wine_id

    caplog.clear()
    assert main([*base, "--input", "sklearn:iris", "--name", "bad name"]) == 2
    assert "breaks the rule" in caplog.text and "preparing" not in caplog.text  # refused first
    assert main([*base, "--input", "sklearn:iris", "--force"]) == 2
    assert "--force only applies with --name" in caplog.text

    assert main(["datasets", "name", "first-iris", iris_id, "--store", store]) == 0
    assert capsys.readouterr().out == f"dataset {iris_id} is named first-iris\n"
    assert main(["datasets", "--store", store]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["NAME", "DATASET", "ID"]
    rows = {line.split()[0]: line.split() for line in table[1:] if line.strip()}
    assert rows["churn-2026-11"][1] == wine_id and rows["first-iris"][1] == iris_id
    assert rows["first-iris"][2] == "120+30"

    assert main(["datasets", "--store", store, "list", "--format", "json"]) == 0
    listed = json.loads(capsys.readouterr().out)
    assert {tuple(entry["names"]) for entry in listed} == {("churn-2026-11",), ("first-iris",)}

    assert main(["datasets", "forget", "first-iris", "--store", store]) == 0
    assert "removed the name first-iris" in capsys.readouterr().out
    assert main(["datasets", "forget", "first-iris", "--store", store]) == 2
    assert main(["datasets", "--store", str(tmp_path / "empty")]) == 0
    assert "no prepared datasets" in capsys.readouterr().out


@pytest.mark.parametrize("dataset_id", ["../../etc", "datasets/x", "0123456789ABCDEF01234567"])
def test_naming_a_dataset_id_that_is_no_id_is_refused_by_the_rule(
    tmp_path: Path, dataset_id: str, caplog: pytest.LogCaptureFixture
) -> None:
    store = str(tmp_path / "runs")
    with pytest.raises(DataError, match=r"breaks the rule \[0-9a-f\]\{24\}") as error:
        name_dataset(store, "x", dataset_id)
    assert repr(dataset_id) in str(error.value)
    with caplog.at_level(logging.ERROR):  # the CLI: exit 2, one line, no traceback
        assert main(["datasets", "--store", store, "name", "x", dataset_id]) == 2
    assert "breaks the rule" in caplog.text and "Traceback" not in caplog.text
