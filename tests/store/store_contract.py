"""The Store contract: every Store implementation's test class inherits this suite.

Subclasses provide a ``store`` fixture yielding an empty store (see
``test_filesystem_store.py``).
"""

from __future__ import annotations

import pickle
import threading

import pytest

from cerebro_spark.store import Store


class StoreContract:
    """Tests of the rules in ``cerebro_spark/store/_base.py``."""

    def test_put_get_round_trip(self, store: Store) -> None:
        store.put("a.bin", b"\x00\x01binary\xff")
        store.put("deep/er/key.txt", b"text")
        assert store.get("a.bin") == b"\x00\x01binary\xff"
        assert store.get("deep/er/key.txt") == b"text"

    def test_put_replaces(self, store: Store) -> None:
        store.put("k", b"old and longer")
        store.put("k", b"new")
        assert store.get("k") == b"new"

    def test_put_empty_bytes(self, store: Store) -> None:
        store.put("empty", b"")
        assert store.exists("empty")
        assert store.get("empty") == b""

    def test_get_missing_names_uri(self, store: Store) -> None:
        with pytest.raises(FileNotFoundError) as info:
            store.get("nothing/here")
        assert store.url("nothing/here") in str(info.value)

    def test_exists(self, store: Store) -> None:
        assert not store.exists("x/y")
        store.put("x/y", b"1")
        assert store.exists("x/y")
        assert not store.exists("x")  # a "directory" is not an object

    def test_list_recursive_sorted_relative(self, store: Store) -> None:
        for key in ["b/2", "a", "b/1", "b/c/3", "ab"]:
            store.put(key, key.encode())
        assert store.list() == ["a", "ab", "b/1", "b/2", "b/c/3"]
        assert store.list("b") == ["b/1", "b/2", "b/c/3"]
        assert store.list("b/") == ["b/1", "b/2", "b/c/3"]
        assert store.list("b/c") == ["b/c/3"]
        assert store.list("missing") == []

    def test_list_empty_store(self, store: Store) -> None:
        assert store.list() == []

    def test_delete(self, store: Store) -> None:
        store.put("d/one", b"1")
        store.put("d/two", b"2")
        store.delete("d/one")
        assert not store.exists("d/one")
        assert store.list() == ["d/two"]
        store.delete("d/one")  # missing: not an error
        store.delete("never/was")

    def test_append(self, store: Store) -> None:
        store.append("log/events.jsonl", b"one\n")
        store.append("log/events.jsonl", b"two\n")
        store.append("log/events.jsonl", b"")
        assert store.get("log/events.jsonl") == b"one\ntwo\n"
        assert store.list() == ["log/events.jsonl"]

    def test_put_leaves_no_temporary_objects(self, store: Store) -> None:
        for i in range(20):
            store.put("ckpt/model.pt", f"version {i}".encode())
        assert store.list() == ["ckpt/model.pt"]
        assert store.get("ckpt/model.pt") == b"version 19"

    def test_failed_put_keeps_old_value(self, store: Store) -> None:
        store.put("k", b"old")
        with pytest.raises(TypeError):
            store.put("k", "not bytes")  # type: ignore[arg-type]
        assert store.get("k") == b"old"
        assert store.list() == ["k"]

    def test_concurrent_puts_never_expose_partial_bytes(self, store: Store) -> None:
        payloads = [bytes([i]) * 200_000 for i in range(1, 5)]
        store.put("shared", payloads[0])
        seen: list[bytes] = []
        stop = threading.Event()

        def read() -> None:
            while not stop.is_set():
                seen.append(store.get("shared"))

        reader = threading.Thread(target=read)
        reader.start()
        try:
            for _ in range(3):
                for payload in payloads:
                    store.put("shared", payload)
        finally:
            stop.set()
            reader.join()
        assert seen
        assert all(value in payloads for value in seen)
        assert store.list() == ["shared"]

    def test_pickle_round_trip(self, store: Store) -> None:
        store.put("p/q", b"pickled")
        blob = pickle.dumps(store)
        assert len(blob) < 1000  # a small spec, no open connections
        clone = pickle.loads(blob)
        assert clone.uri == store.uri
        assert clone.get("p/q") == b"pickled"
        clone.put("p/r", b"from the clone")
        assert store.get("p/r") == b"from the clone"

    def test_child(self, store: Store) -> None:
        child = store.child("sub/dir")
        child.put("k", b"v")
        assert store.get("sub/dir/k") == b"v"
        assert child.list() == ["k"]
        assert child.url("k") == store.url("sub/dir/k")
        assert pickle.loads(pickle.dumps(child)).get("k") == b"v"

    @pytest.mark.parametrize(
        ("key", "rule"),
        [
            ("", "empty"),
            ("/abs", "start with '/'"),
            ("a/../b", ".."),
            ("..", ".."),
            ("a//b", "empty or '.'"),
            ("a/./b", "empty or '.'"),
            ("trailing/", "empty or '.'"),
        ],
    )
    def test_bad_keys(self, store: Store, key: str, rule: str) -> None:
        for operation in (
            lambda: store.put(key, b"x"),
            lambda: store.get(key),
            lambda: store.exists(key),
            lambda: store.delete(key),
            lambda: store.append(key, b"x"),
            lambda: store.url(key),
        ):
            with pytest.raises(ValueError, match=rule) as info:
                operation()
            if key:
                assert repr(key) in str(info.value)
        assert store.list() == []
