from __future__ import annotations

import json
import os
import pickle
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pyarrow.fs as pafs
import pytest
from store_contract import StoreContract

from cerebro_spark.errors import ConfigError
from cerebro_spark.store import FileSystemStore, Store, open_store, resolve_filesystem


@pytest.fixture(params=["local", "s3"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Store]:
    if request.param == "local":
        yield open_store(str(tmp_path / "store"))
    else:
        s3_server: Any = request.getfixturevalue("s3_server")
        yield open_store(s3_server.uri("root/prefix"))


class TestFileSystemStore(StoreContract):
    pass


# -- local specifics --------------------------------------------------------------------------


def test_local_put_leaves_no_temp_files_on_disk(tmp_path: Path) -> None:
    store = FileSystemStore(str(tmp_path))
    for i in range(5):
        store.put("dir/file", str(i).encode())
    with pytest.raises(TypeError):
        store.put("dir/file", 12345)  # type: ignore[arg-type]
    assert sorted(os.listdir(tmp_path / "dir")) == ["file"]


def test_local_append_is_in_place(tmp_path: Path) -> None:
    store = FileSystemStore(str(tmp_path))
    store.append("log", b"a")
    inode = os.stat(tmp_path / "log").st_ino
    store.append("log", b"b")
    assert os.stat(tmp_path / "log").st_ino == inode
    assert (tmp_path / "log").read_bytes() == b"ab"


def test_list_hides_leftover_temp_files(tmp_path: Path) -> None:
    store = FileSystemStore(str(tmp_path))
    store.put("k", b"1")
    (tmp_path / ("k.cerebro-tmp-" + "0" * 32)).write_bytes(b"partial")
    assert store.list() == ["k"]
    with pytest.raises(ValueError, match="reserved"):
        store.put("k.cerebro-tmp-x", b"1")


def test_relative_path_becomes_absolute(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    store = FileSystemStore("rel/store")
    assert store.uri == str(tmp_path / "rel" / "store")
    store.put("k", b"v")
    monkeypatch.chdir("/")
    assert pickle.loads(pickle.dumps(store)).get("k") == b"v"


def test_file_uri(tmp_path: Path) -> None:
    store = open_store(f"file://{tmp_path}/x")
    store.put("k", b"v")
    assert (tmp_path / "x" / "k").read_bytes() == b"v"
    assert store.uri == str(tmp_path / "x")
    assert store == FileSystemStore(str(tmp_path / "x"))


def test_get_missing_local_message(tmp_path: Path) -> None:
    store = FileSystemStore(str(tmp_path))
    with pytest.raises(FileNotFoundError, match=str(tmp_path / "nope")):
        store.get("nope")


def test_open_store_passes_stores_through(tmp_path: Path) -> None:
    store = FileSystemStore(str(tmp_path))
    assert open_store(store) is store


# -- resolve_filesystem -----------------------------------------------------------------------


def test_resolve_local_forms(tmp_path: Path) -> None:
    fs, path = resolve_filesystem(str(tmp_path))
    assert isinstance(fs, pafs.LocalFileSystem)
    assert path == str(tmp_path)
    fs2, path2 = resolve_filesystem(f"file://{tmp_path}")
    assert isinstance(fs2, pafs.LocalFileSystem)
    assert path2 == str(tmp_path)


def test_resolve_s3_is_cached_per_options() -> None:
    uri = "s3://bucket/pre/fix?endpoint_override=127.0.0.1:1&scheme=http&region=us-east-1"
    fs, path = resolve_filesystem(uri)
    assert path == "bucket/pre/fix"
    assert fs.region == "us-east-1"
    same, _ = resolve_filesystem(
        "s3://bucket/other?scheme=http&region=us-east-1&endpoint_override=127.0.0.1:1"
    )
    assert same is fs
    other, _ = resolve_filesystem(
        "s3://bucket/x?endpoint_override=127.0.0.1:2&scheme=http&region=us-east-1"
    )
    assert other is not fs


@pytest.mark.parametrize(
    "uri", ["", "s3:///no-bucket", "s3://b/x?no_such_option=1", "file://host/path"]
)
def test_resolve_bad_uris(uri: str) -> None:
    with pytest.raises(ConfigError) as info:
        resolve_filesystem(uri)
    if uri:
        assert uri in str(info.value)


def test_s3_store_uri_keeps_options(s3_server: Any) -> None:
    uri = s3_server.uri("a/b")
    store = open_store(uri)
    assert store.uri == uri
    assert store.url("c/d.txt").startswith(f"s3://{s3_server.bucket}/a/b/c/d.txt?")
    store.put("c/d.txt", b"x")
    objects = s3_server.client().list_objects_v2(Bucket=s3_server.bucket)["Contents"]
    assert [obj["Key"] for obj in objects] == ["a/b/c/d.txt"]


def test_s3_object_written_by_boto3_is_visible(s3_server: Any) -> None:
    s3_server.client().put_object(Bucket=s3_server.bucket, Key="p/ext.bin", Body=b"boto")
    store = open_store(s3_server.uri("p"))
    assert store.list() == ["ext.bin"]
    assert store.get("ext.bin") == b"boto"


def test_s3_get_reads_an_object_in_one_get_request(
    s3_server: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A pyarrow stream's read() asks for 256 KiB at a time, one GET each (9 for 2 MB)."""
    from moto.moto_api import recorder  # records the requests that reach the moto server

    store = open_store(s3_server.uri("big"))
    payload = os.urandom(2 * 1024 * 1024 + 17)
    store.put("part.parquet", payload)
    recording = tmp_path / "requests.jsonl"
    monkeypatch.setattr(recorder, "_location", str(recording))
    monkeypatch.setattr(recorder, "_user_enabled", True)
    assert store.get("part.parquet") == payload
    monkeypatch.setattr(recorder, "_user_enabled", False)
    requests = [json.loads(line) for line in recording.read_text().splitlines()]
    gets = [r for r in requests if r["method"] == "GET" and "part.parquet" in r["url"]]
    assert len(gets) == 1, gets


@pytest.mark.parametrize(
    ("uri", "fuse"), [("dbfs:/mnt/lake/runs", "/dbfs/mnt/lake/runs"), ("DBFS:///x", "/dbfs/x")]
)
def test_a_dbfs_uri_is_refused_with_its_fuse_path(uri: str, fuse: str) -> None:
    """Spark's dbfs: scheme used to become a local folder named 'dbfs:' (issue 28, part 4)."""
    with pytest.raises(ConfigError, match=f"use its FUSE path '{fuse}', or a Unity Catalog"):
        resolve_filesystem(uri)


def test_volume_and_fuse_paths_are_local_paths(tmp_path: Path) -> None:
    for path in ("/Volumes/main/ml/runs/cerebro", "/dbfs/mnt/lake/cerebro"):
        filesystem, resolved = resolve_filesystem(path)
        assert filesystem.type_name == "local" and resolved == path
