"""A FileSystem for a test scheme, ``specragtest://``, stored under a local folder.

Beam finds FileSystem subclasses by scheme, so once this module is imported every job path
``specragtest://...`` goes through it: a job that works here touches its files only through
Beam's FileSystems, as it must on gs:// or s3://. ``ROOT`` is set by the test.
"""
from __future__ import annotations

import os

from apache_beam.io.filesystem import FileMetadata
from apache_beam.io.localfilesystem import LocalFileSystem

SCHEME = "specragtest"
PREFIX = f"{SCHEME}://"
ROOT = {"path": None}
CALLS = {"n": 0}  # how many operations went through this file system
# a store that goes away mid-run: after this many result shards, every write, rename and delete fails
BREAK_AFTER = {"results": None, "written": 0}


def _check_store(path: str = "") -> None:
    limit = BREAK_AFTER["results"]
    if limit is not None and BREAK_AFTER["written"] >= limit:
        raise IOError(f"the store is unavailable (writing {path})")


class TestSchemeFileSystem(LocalFileSystem):
    @classmethod
    def scheme(cls):
        return SCHEME

    def _local(self, path: str) -> str:
        if not path.startswith(PREFIX):  # LocalFileSystem calls itself back with local paths
            return path
        CALLS["n"] += 1
        return os.path.join(ROOT["path"], path[len(PREFIX):])

    def _remote(self, local: str) -> str:
        return PREFIX + os.path.relpath(local, ROOT["path"])

    def join(self, basepath, *paths):
        return "/".join([basepath.rstrip("/"), *(p.strip("/") for p in paths)])

    def split(self, path):
        head, _, tail = path.rstrip("/").rpartition("/")
        return head, tail

    def mkdirs(self, path):
        return super().mkdirs(self._local(path))

    def _list(self, dir_or_prefix):
        for m in super()._list(self._local(dir_or_prefix)):
            yield FileMetadata(self._remote(m.path), m.size_in_bytes, m.last_updated_in_seconds)

    def create(self, path, *args, **kwargs):
        _check_store(path)
        return super().create(self._local(path), *args, **kwargs)

    def open(self, path, *args, **kwargs):
        return super().open(self._local(path), *args, **kwargs)

    def copy(self, sources, destinations):
        return super().copy([self._local(s) for s in sources], [self._local(d) for d in destinations])

    def rename(self, sources, destinations):
        _check_store(destinations[0] if destinations else "")
        if any("/results-" in d for d in destinations):
            BREAK_AFTER["written"] += 1
        return super().rename([self._local(s) for s in sources], [self._local(d) for d in destinations])

    def exists(self, path):
        return super().exists(self._local(path))

    def size(self, path):
        return super().size(self._local(path))

    def last_updated(self, path):
        return super().last_updated(self._local(path))

    def checksum(self, path):
        return super().checksum(self._local(path))

    def metadata(self, path):
        m = super().metadata(self._local(path))
        return FileMetadata(path, m.size_in_bytes, m.last_updated_in_seconds)

    def delete(self, paths):
        _check_store(paths[0] if paths else "")
        return super().delete([self._local(p) for p in paths])
