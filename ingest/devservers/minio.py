"""A throwaway MinIO (built from its Go module by setup) serving S3 on a free port."""

from __future__ import annotations

import shutil
import tempfile
import time
import urllib.request
from pathlib import Path
from types import TracebackType
from typing import Any

from ingest.devservers.process import ServerProcess, find_program, free_port
from ingest.runtime.cache import tools_dir


class MinioServer:
    """MinIO with generated root credentials; `bucket()` creates a bucket through boto3."""

    def __init__(self, access_key: str = "ingest-minio", secret_key: str = "ingest-minio-secret") -> None:
        self.host = "127.0.0.1"
        self.port = free_port()
        self.console_port = free_port()
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = "us-east-1"
        self.base_dir = Path(tempfile.mkdtemp(prefix="ingest-minio-"))
        self.buckets: list[str] = []
        """The buckets `bucket()` made, in order, less those dropped."""
        self._process: ServerProcess | None = None

    @property
    def endpoint(self) -> str:
        return f"http://{self.host}:{self.port}"

    def start(self) -> MinioServer:
        minio = find_program("minio", tools_dir() / "bin")
        (self.base_dir / "data").mkdir(exist_ok=True)
        self._process = ServerProcess(
            "minio",
            [
                minio,
                "server",
                str(self.base_dir / "data"),
                "--address",
                f"{self.host}:{self.port}",
                "--console-address",
                f"{self.host}:{self.console_port}",
                "--quiet",
            ],
            self.base_dir / "minio.log",
            # Credentials go through the environment, never argv (visible in `ps`).
            env={
                "MINIO_ROOT_USER": self.access_key,
                "MINIO_ROOT_PASSWORD": self.secret_key,
                "MINIO_BROWSER": "off",
                "MINIO_UPDATE": "off",
            },
        )
        self._process.wait_until(self._ready, timeout=60)
        return self

    def _ready(self) -> bool:
        with urllib.request.urlopen(f"{self.endpoint}/minio/health/ready", timeout=2) as resp:
            return bool(resp.status == 200)

    def s3_client(self) -> Any:
        import boto3

        return boto3.client(
            "s3",
            endpoint_url=self.endpoint,
            aws_access_key_id=self.access_key,
            aws_secret_access_key=self.secret_key,
            region_name=self.region,
        )

    def bucket(self, name: str) -> str:
        self.s3_client().create_bucket(Bucket=name)
        self.buckets.append(name)
        return name

    def drop_bucket(self, name: str) -> None:
        """Deletes a bucket with every object in it."""
        client = self.s3_client()
        for page in client.get_paginator("list_objects_v2").paginate(Bucket=name):
            keys = [{"Key": item["Key"]} for item in page.get("Contents", [])]
            if keys:
                client.delete_objects(Bucket=name, Delete={"Objects": keys, "Quiet": True})
        client.delete_bucket(Bucket=name)
        self.buckets.remove(name)

    def restart(self, pause_seconds: float) -> None:
        """Stop the server, wait, and start it again on the same port with the same data (for fault tests)."""
        if self._process is not None:
            self._process.stop()
            self._process = None
        time.sleep(pause_seconds)
        self.start()

    def stop(self) -> None:
        if self._process is not None:
            self._process.stop()
            self._process = None
        shutil.rmtree(self.base_dir, ignore_errors=True)

    def __enter__(self) -> MinioServer:
        return self.start()

    def __exit__(self, et: type[BaseException] | None, e: BaseException | None, tb: TracebackType | None) -> None:
        self.stop()
