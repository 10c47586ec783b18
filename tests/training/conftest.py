"""Fixtures for the training tests: an in-memory Store (an httpx-style test fake)."""

import pytest

from cerebro_spark.store import Store


class MemoryStore(Store):
    """Bytes in a dict; ``child`` shares the dict under a key prefix."""

    def __init__(self, objects: dict[str, bytes] | None = None, prefix: str = "") -> None:
        self.objects = {} if objects is None else objects
        self.prefix = prefix

    uri = property(lambda self: f"memory://{self.prefix}")

    def put(self, key, data):
        self.objects[self.prefix + key] = bytes(data)

    def get(self, key):
        if self.prefix + key not in self.objects:
            raise FileNotFoundError(self.url(key))
        return self.objects[self.prefix + key]

    def exists(self, key):
        return self.prefix + key in self.objects

    def list(self, prefix=""):
        full = self.prefix + prefix
        return sorted(k[len(self.prefix) :] for k in self.objects if k.startswith(full))

    def delete(self, key):
        self.objects.pop(self.prefix + key, None)

    def append(self, key, data):
        self.put(key, self.objects.get(self.prefix + key, b"") + data)

    def url(self, key):
        return f"memory://{self.prefix}{key}"

    def child(self, prefix):
        return MemoryStore(self.objects, f"{self.prefix}{prefix.rstrip('/')}/")


@pytest.fixture
def store() -> MemoryStore:
    return MemoryStore()


@pytest.fixture(autouse=True)
def one_torch_thread():
    """Pin intra-op threads as workers do (WorkerJob.torch_threads, default 1)."""
    import torch

    previous = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(previous)
