"""Shared fixtures: loopback servers and dataset writers."""

from __future__ import annotations

import itertools

import pytest

from servers import S3Server, start_s3_server

_bucket_ids = itertools.count()


@pytest.fixture(scope="session")
def s3_server() -> S3Server:
    """One moto S3 server for the whole session, on 127.0.0.1 and a free port."""
    server = start_s3_server()
    yield server
    server.stop()


@pytest.fixture
def s3_bucket(s3_server: S3Server) -> str:
    """A fresh, empty bucket on the session's S3 server; returns its name."""
    name = f"bucket-{next(_bucket_ids)}"
    s3_server.create_bucket(name)
    return name
