"""Job I/O through Beam's FileSystems: local paths, gs://, s3:// (and any registered scheme) alike.

Every read and write of a job goes through these helpers (queries, results, dead letters,
manifests, resume, indexes and datastores), so a job that runs on local files runs unchanged
on a distributed file system. Parquet is opened through a FileSystems stream; a file that is
not readable Parquet is an ``UnreadableInput`` naming the file, never a bare traceback.
"""
from __future__ import annotations

import contextlib
import functools
import hashlib
import os
import shutil
import uuid
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
from apache_beam.io.filesystem import BeamIOError, CompressionTypes
from apache_beam.io.filesystems import FileSystems


def share_botocore_loader() -> None:
    """One botocore data loader per process instead of one per client (called before the first
    s3:// operation of a process, never on import).

    Beam's S3 filesystem builds a new boto3 session and client for every operation (exists,
    open, rename, delete...), and each new session re-parses botocore's service JSON: 0.16 s a
    client here, 22 s of a 33 s build-index of 36 passages on S3. Sharing the (read-only) loader
    keeps what Beam does and makes a client 0.035 s."""
    try:
        import botocore.loaders
        import botocore.session
    except ImportError:  # no S3 support installed
        return
    if not hasattr(botocore.session.create_loader, "cache_info"):
        botocore.session.create_loader = functools.lru_cache(maxsize=None)(botocore.loaders.create_loader)


def _for(path) -> str:
    """``path`` as a string, with the S3 client set-up shared first when it is an s3:// path."""
    path = str(path)
    if path.startswith("s3://"):
        share_botocore_loader()
    return path


class ShardWriteError(OSError):
    """A job's output file that could not be written, in one line: which, where, the OS's words.
    One string argument, so Beam's runners re-raise it as itself with the step's name appended
    (an OSError with errno and filename reaches the launcher as a RuntimeError of its repr)."""


def os_error(error: BaseException) -> str:
    """The innermost OS error of ``error`` as `PermissionError: [Errno 1] Operation not permitted`
    (Beam's BeamIOError keeps each file's exception in ``exception_details``)."""
    details = getattr(error, "exception_details", None)
    if isinstance(details, dict) and details:
        error = next(iter(details.values()))
    while isinstance(error, OSError) and error.args and isinstance(error.args[0], BaseException):
        error = error.args[0]  # Beam's OSError(PermissionError(...))
    if isinstance(error, OSError) and error.errno is not None:
        return f"{type(error).__name__}: [Errno {error.errno}] {error.strerror}"
    return f"{type(error).__name__}: {error}"


class UnreadableInput(ValueError):
    """A file that exists but cannot be read as what it should be (e.g. corrupt Parquet)."""


def join(base: str, *parts: str) -> str:
    return FileSystems.join(str(base), *parts)


def is_local(path: str) -> bool:
    return FileSystems.get_scheme(str(path)) in (None, "file")


_NOT_FOUND = ("not found", "nosuchkey", "nosuchbucket", "no such file", "404")


def _root_cause(error: BaseException) -> BaseException:
    """The innermost exception of a BeamIOError (they nest one per filesystem call)."""
    while isinstance(error, BeamIOError) and error.exception_details:
        error = next(iter(error.exception_details.values()))
    return error


def match_files(pattern: str) -> list[str]:
    """Sorted paths matching a glob (empty when nothing matches or the folder is missing); a
    filesystem that cannot be reached or used (credentials, options, a missing client library)
    is an OSError with its cause, never an empty match."""
    try:
        result = FileSystems.match([_for(pattern)])[0]
    except BeamIOError as e:
        cause = _root_cause(e)
        if isinstance(cause, FileNotFoundError) or any(w in str(cause).lower() for w in _NOT_FOUND):
            return []
        raise OSError(f"cannot list {pattern}: {type(cause).__name__}: {cause}") from e
    except ValueError as e:  # no filesystem for the scheme (e.g. gs:// without apache-beam[gcp])
        raise OSError(f"cannot list {pattern}: {e}") from e
    return sorted(m.path for m in result.metadata_list)


def check_buckets(paths: list[str], options) -> None:
    """Fail fast, with the cause, when an S3 bucket that a command names cannot be used.

    Beam's S3 filesystem retries every failed call with backoff (and botocore under it), so an
    unreachable endpoint or missing credentials would hang the launcher for minutes before an
    error; one head_bucket per bucket, without retries, says at once what is wrong."""
    buckets = sorted({p[len("s3://"):].split("/", 1)[0] for p in map(str, paths) if p.startswith("s3://")})
    if not buckets:
        return
    share_botocore_loader()
    try:
        import boto3
        import botocore.config
        import botocore.exceptions
    except ImportError as e:
        raise OSError(f"s3:// paths need boto3: pip install 'specrag[aws]' ({e})") from e
    from apache_beam.options.pipeline_options import S3Options
    s3 = options.view_as(S3Options)
    client = boto3.session.Session().client(
        "s3", endpoint_url=s3.s3_endpoint_url, region_name=s3.s3_region_name, verify=s3.s3_verify,
        use_ssl=not s3.s3_disable_ssl, aws_access_key_id=s3.s3_access_key_id,
        aws_secret_access_key=s3.s3_secret_access_key, aws_session_token=s3.s3_session_token,
        config=botocore.config.Config(connect_timeout=10, read_timeout=30, retries={"max_attempts": 1}))
    for bucket in buckets:
        try:
            client.head_bucket(Bucket=bucket)
        except botocore.exceptions.ClientError as e:
            code = e.response.get("Error", {}).get("Code", "")
            what = {"404": "does not exist", "NoSuchBucket": "does not exist",
                    "403": "is not readable with these credentials"}.get(code, f"cannot be used ({e})")
            raise OSError(f"S3 bucket {bucket!r} {what}") from e
        except botocore.exceptions.NoCredentialsError as e:
            raise OSError(f"no S3 credentials for bucket {bucket!r}: pass --s3_access_key_id and "
                          "--s3_secret_access_key, or set AWS_ACCESS_KEY_ID / AWS_SECRET_ACCESS_KEY") from e
        except botocore.exceptions.BotoCoreError as e:
            raise OSError(f"cannot reach S3 for bucket {bucket!r}: {e}") from e


def sizes(pattern: str) -> dict[str, int]:
    """{path: bytes} of the files matching a glob, from one listing (no file is opened)."""
    try:
        result = FileSystems.match([_for(pattern)])[0]
    except BeamIOError:
        return {}
    return {m.path: m.size_in_bytes for m in result.metadata_list}


def exists(path: str) -> bool:
    return FileSystems.exists(_for(path))


def mkdirs(path: str) -> None:
    if is_local(path):
        Path(path).mkdir(parents=True, exist_ok=True)
    elif not FileSystems.exists(str(path)):
        try:
            FileSystems.mkdirs(str(path))
        except IOError:  # object stores have no folders, or it appeared meanwhile
            pass


def delete(paths: list[str]) -> None:
    if paths:
        FileSystems.delete(list(paths))


def read_bytes(path: str) -> bytes:
    with FileSystems.open(_for(path), compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        return fh.read()


def write_bytes(path: str, data: bytes) -> None:
    """Written under a temporary name, then renamed: readers never see half a file."""
    tmp = join(FileSystems.split(_for(path))[0], f".{uuid.uuid4().hex}.inprogress")
    try:
        with FileSystems.create(tmp, compression_type=CompressionTypes.UNCOMPRESSED) as fh:
            fh.write(data)
        if FileSystems.exists(str(path)):
            FileSystems.delete([str(path)])
        FileSystems.rename([tmp], [str(path)])
    except BaseException:
        with contextlib.suppress(Exception):  # no temporary file left behind where it can be removed
            if FileSystems.exists(tmp):
                FileSystems.delete([tmp])
        raise


def read_text(path: str) -> str:
    return read_bytes(path).decode("utf-8")


def write_text(path: str, text: str) -> None:
    write_bytes(path, text.encode("utf-8"))


def open_parquet(path: str) -> pq.ParquetFile:
    try:
        return pq.ParquetFile(FileSystems.open(_for(path), compression_type=CompressionTypes.UNCOMPRESSED))
    except (pa.ArrowInvalid, pa.ArrowException, OSError, BeamIOError) as e:
        raise UnreadableInput(f"{path}: not a readable Parquet file ({type(e).__name__}: {e})") from None


def read_parquet(path: str, columns: list[str] | None = None) -> pa.Table:
    return open_parquet(path).read(columns=columns)


def write_parquet(path: str, table: pa.Table) -> None:
    sink = pa.BufferOutputStream()
    pq.write_table(table, sink)
    write_bytes(path, sink.getvalue().to_pybytes())


def sha256_of(path: str) -> str:
    h = hashlib.sha256()
    with FileSystems.open(str(path), compression_type=CompressionTypes.UNCOMPRESSED) as fh:
        for block in iter(lambda: fh.read(1 << 22), b""):
            h.update(block)
    return h.hexdigest()


def content_identity(path: str) -> dict:
    """What a file holds, without reading it where the store already says: a local file's
    sha256; an object's checksum as its store keeps it (S3 ETag, GCS crc32c) and size, so the
    launcher never streams a corpus-sized input out of a bucket to fingerprint it."""
    if is_local(path):
        return {"sha256": sha256_of(path)}
    [metadata] = FileSystems.match([str(path)])[0].metadata_list
    return {"checksum": f"{FileSystems.get_scheme(str(path))}:{FileSystems.checksum(str(path))}",
            "size": metadata.size_in_bytes}


def localize(folder: str, cache: Path) -> str:
    """A local copy of a remote folder (an index, a datastore): libraries such as FAISS and
    bm25s read local files. Copied once per worker machine, keyed by the folder's manifest."""
    if is_local(folder):
        return str(folder)
    manifest = join(folder, "manifest.json")
    key = hashlib.sha256((str(folder) + read_text(manifest)).encode()).hexdigest()[:16]
    target = cache / "remote" / key
    if (target / ".complete").exists():
        return str(target)
    staging = cache / "remote" / f".{key}.{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    prefix = str(folder).rstrip("/") + "/"
    for path in match_files(prefix + "**"):
        local = staging / path[len(prefix):]
        local.parent.mkdir(parents=True, exist_ok=True)
        local.write_bytes(read_bytes(path))
    (staging / ".complete").write_text(str(folder))
    try:
        staging.rename(target)
    except OSError:  # another worker finished first
        shutil.rmtree(staging, ignore_errors=True)
    return str(target)


def publish(local_dir: Path | str, folder: str, *, skip: tuple[str, ...] = ()) -> None:
    """Copy a folder built locally (an index, a datastore) to ``folder`` on any FileSystems
    scheme, manifest last: a reader never sees a manifest whose files are not there yet."""
    local_dir = Path(local_dir)
    files = sorted(p for p in local_dir.rglob("*") if p.is_file() and not any(p.is_relative_to(local_dir / s)
                                                                                for s in skip))
    files.sort(key=lambda p: p.name == "manifest.json")
    for path in files:
        write_bytes(join(folder, *path.relative_to(local_dir).parts), path.read_bytes())


def remove_tree(folder: str) -> None:
    """Delete a folder and everything under it, on any scheme (no error when it is missing)."""
    if is_local(folder):
        shutil.rmtree(folder, ignore_errors=True)
    else:
        delete(match_files(str(folder).rstrip("/") + "/**"))
