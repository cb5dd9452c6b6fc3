"""An S3-compatible server on loopback (moto's server mode) for tests of object storage."""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager

S3_ENV = {
    "AWS_ACCESS_KEY_ID": "testing",
    "AWS_SECRET_ACCESS_KEY": "testing",
    "AWS_DEFAULT_REGION": "us-east-1",
    "AWS_EC2_METADATA_DISABLED": "true",
}


def s3_keys(storage_uri: str, prefix: str) -> list[str]:
    """The object keys under `prefix` of the storage at `storage_uri` ([] when there are none)."""
    import pyarrow.fs as pafs

    fs, root = pafs.FileSystem.from_uri(storage_uri)
    selector = pafs.FileSelector(f"{root}/{prefix}", recursive=True, allow_not_found=True)
    return [i.path for i in fs.get_file_info(selector) if i.type == pafs.FileType.File]


@contextmanager
def s3_server(bucket: str) -> Iterator[str]:
    """Start moto's S3 server on 127.0.0.1 with `bucket`; yields the storage URI of a prefix in it. The
    credentials it accepts are put in this process's environment (Ray workers get S3_ENV explicitly)."""
    import pyarrow.fs as pafs
    from moto.server import ThreadedMotoServer

    os.environ.update(S3_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        endpoint = f"{host}:{port}"
        pafs.S3FileSystem(endpoint_override=endpoint, scheme="http", allow_bucket_creation=True).create_dir(bucket)
        yield f"s3://{bucket}/checkpoints?endpoint_override={endpoint}&scheme=http&region=us-east-1"
    finally:
        server.stop()
