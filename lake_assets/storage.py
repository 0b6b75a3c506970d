"""Listing, reading and copying files under `file://` and `s3a://` URIs (pyarrow.fs).

Spark does the data work; this module does the small metadata work around it that Spark has no
API for: listing a landing folder for the sensor, reading a Parquet footer to vet a file,
copying a bad file to quarantine, removing a partition folder.
"""

from __future__ import annotations

import dataclasses
import os
from typing import Iterator

import pyarrow.fs as pafs

from lake_assets.paths import is_s3


@dataclasses.dataclass(frozen=True)
class Entry:
    uri: str
    name: str
    is_dir: bool
    size: int
    mtime_ms: int | None


@dataclasses.dataclass(frozen=True)
class S3Settings:
    """Endpoint and region; access keys are read from the environment when a client is made."""

    endpoint_url: str | None = None
    region: str = "us-east-1"


class Storage:
    def __init__(self, s3: S3Settings | None = None):
        self._s3_settings = s3 or S3Settings()
        self._s3: pafs.FileSystem | None = None
        self._local = pafs.LocalFileSystem()

    def _s3_fs(self) -> pafs.FileSystem:
        if self._s3 is None:
            settings = self._s3_settings
            kwargs: dict = {"region": settings.region}
            key = os.environ.get("AWS_ACCESS_KEY_ID")
            secret = os.environ.get("AWS_SECRET_ACCESS_KEY")
            if key and secret:
                kwargs.update(access_key=key, secret_key=secret, session_token=os.environ.get("AWS_SESSION_TOKEN"))
            if settings.endpoint_url:
                scheme, _, host = settings.endpoint_url.partition("://")
                kwargs.update(endpoint_override=host or scheme, scheme=scheme if host else "https")
                kwargs["force_virtual_addressing"] = False
            self._s3 = pafs.S3FileSystem(**kwargs)
        return self._s3

    def resolve(self, uri: str) -> tuple[pafs.FileSystem, str]:
        if is_s3(uri):
            return self._s3_fs(), uri.split("://", 1)[1]
        if uri.startswith("file://"):
            return self._local, uri[len("file://"):]
        raise ValueError(f"unsupported URI {uri!r}")

    @staticmethod
    def _uri(prefix_uri: str, name: str) -> str:
        return prefix_uri.rstrip("/") + "/" + name

    def list(self, uri: str) -> list[Entry]:
        """Immediate children of a folder; an absent folder lists as empty."""
        fs, path = self.resolve(uri)
        infos = fs.get_file_info(pafs.FileSelector(path, allow_not_found=True, recursive=False))
        out = []
        for info in infos:
            if info.type == pafs.FileType.NotFound:
                continue
            mtime = int(info.mtime.timestamp() * 1000) if info.mtime is not None else None
            out.append(
                Entry(
                    uri=self._uri(uri, info.base_name),
                    name=info.base_name,
                    is_dir=info.type == pafs.FileType.Directory,
                    size=info.size or 0,
                    mtime_ms=mtime,
                )
            )
        return sorted(out, key=lambda e: e.name)

    def walk_files(self, uri: str) -> Iterator[Entry]:
        for entry in self.list(uri):
            if entry.is_dir:
                yield from self.walk_files(entry.uri)
            else:
                yield entry

    def exists(self, uri: str) -> bool:
        fs, path = self.resolve(uri)
        return fs.get_file_info(path).type != pafs.FileType.NotFound

    def read_bytes(self, uri: str) -> bytes:
        fs, path = self.resolve(uri)
        with fs.open_input_stream(path) as handle:
            return handle.read()

    def open_input_file(self, uri: str):
        fs, path = self.resolve(uri)
        return fs.open_input_file(path)

    def write_bytes(self, uri: str, data: bytes) -> None:
        fs, path = self.resolve(uri)
        parent = path.rsplit("/", 1)[0]
        fs.create_dir(parent, recursive=True)
        with fs.open_output_stream(path) as handle:
            handle.write(data)

    def copy(self, src: str, dst: str) -> None:
        src_fs, src_path = self.resolve(src)
        dst_fs, dst_path = self.resolve(dst)
        if src_fs is dst_fs:
            dst_fs.create_dir(dst_path.rsplit("/", 1)[0], recursive=True)
            dst_fs.copy_file(src_path, dst_path)
        else:
            self.write_bytes(dst, self.read_bytes(src))

    def delete_tree(self, uri: str) -> None:
        fs, path = self.resolve(uri)
        if fs.get_file_info(path).type == pafs.FileType.Directory:
            fs.delete_dir(path)

    def delete_file(self, uri: str) -> None:
        fs, path = self.resolve(uri)
        if fs.get_file_info(path).type == pafs.FileType.File:
            fs.delete_file(path)

    def move_file(self, src: str, dst: str) -> None:
        """Make `dst` appear whole: a rename on a file system, a server-side copy on S3."""
        fs, src_path = self.resolve(src)
        _, dst_path = self.resolve(dst)
        fs.create_dir(dst_path.rsplit("/", 1)[0], recursive=True)
        if is_s3(src):
            fs.copy_file(src_path, dst_path)
            fs.delete_file(src_path)
        else:
            fs.move(src_path, dst_path)

    def move_tree(self, src: str, dst: str) -> None:
        """Move a folder: one rename on a file system, a copy per object then a delete on S3."""
        fs, src_path = self.resolve(src)
        _, dst_path = self.resolve(dst)
        if not is_s3(src):
            fs.create_dir(dst_path.rsplit("/", 1)[0], recursive=True)
            fs.move(src_path, dst_path)
            return
        for entry in list(self.walk_files(src)):
            self.copy(entry.uri, dst.rstrip("/") + entry.uri[len(src.rstrip("/")):])
        self.delete_tree(src)
