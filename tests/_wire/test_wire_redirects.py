"""Redirects through each client: followed as obstore follows them, bounded, and handed to obstore where the engine cannot go."""

from __future__ import annotations

import pytest
from scripted import WIRE_CLIENTS, read_through
from zarr.abc.store import RangeByteRequest

from insitubatch._wire.faults import RedirectError
from insitubatch._wire.redirects import MAX_REDIRECTS, next_hop, region_of
from insitubatch.stores.read_policy import Outcome, classify
from insitubatch.testing.emulator import Request, answer, ranged

BODY = bytes(range(256)) * 16
KEY = "d/c/0.0"


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


def _files(request: Request) -> bytes:
    return ranged(BODY, request.headers.get("range"))


@pytest.mark.parametrize("client", WIRE_CLIENTS)
@pytest.mark.parametrize("status", [301, 302, 303, 307, 308])
def test_a_redirect_to_another_host_is_followed(scripted, client: str, status: int) -> None:
    cdn = scripted(_files)
    origin = scripted(lambda r: answer(status, Location=cdn.url_for(f"edge{r.path}?exp=9&sig=z")))
    assert read_through(client, origin.url_for("ds"), KEY, RangeByteRequest(3, 40)) == BODY[3:40]
    assert read_through(client, origin.url_for("ds"), KEY) == BODY
    seen = cdn.requests[0]
    assert (seen.path, seen.query, seen.headers["range"]) == (f"/edge/ds/{KEY}", "exp=9&sig=z", "bytes=3-39")
    assert seen.headers["host"] == f"127.0.0.1:{cdn.port}"


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_relative_redirect_and_a_chain_of_them_are_followed(scripted, client: str) -> None:
    def answers(request: Request) -> bytes:
        hop = request.path.count("/again")
        if hop < 3:
            return answer(302, Location=f"/again{request.path}")
        return _files(request)

    server = scripted(answers)
    assert read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 10)) == BODY[:10]
    assert [r.path for r in server.requests] == [f"{'/again' * i}/ds/{KEY}" for i in range(4)]


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_redirect_loop_is_an_error_after_a_bounded_number_of_hops(scripted, client: str) -> None:
    server = scripted(lambda r: answer(302, Location=r.target))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 10))
    assert isinstance(got, Exception), got
    if client == "engine":
        assert isinstance(got, RedirectError) and classify(got) is Outcome.FATAL
        assert f"more than {MAX_REDIRECTS} redirects" in str(got)
        assert len(server.requests) == MAX_REDIRECTS + 1  # one read, no retry
    else:
        assert len(server.requests) % (MAX_REDIRECTS + 1) == 0


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_redirect_without_location_naming_a_region_is_an_error_naming_it(scripted, client: str) -> None:
    body = b"<Error><Code>PermanentRedirect</Code><Endpoint>b.s3.eu-west-2.amazonaws.com</Endpoint></Error>"
    server = scripted(lambda r: answer(301, body, x_amz_bucket_region="eu-west-2"))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 10))
    assert isinstance(got, Exception), got
    if client == "engine":
        assert "region 'eu-west-2'" in str(got) and "region='eu-west-2'" in str(got)
        assert classify(got) is Outcome.FATAL and len(server.requests) == 1
    else:
        assert "redirect without LOCATION" in str(got)


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_redirect_to_a_protocol_the_engine_does_not_speak_goes_to_obstore(scripted, client: str) -> None:
    server = scripted(lambda r: answer(302, Location="ftp://127.0.0.1:9/x"))
    got = read_through(client, server.url_for("ds"), KEY, RangeByteRequest(0, 10))
    assert isinstance(got, Exception), got  # obstore cannot follow it either
    agents = [r.headers["user-agent"].split("/")[0] for r in server.requests]
    assert agents[-1] == "object_store"  # the read went to obstore, which asked again itself
    assert agents[0] == ("insitubatch" if client == "engine" else "object_store")


def test_a_plain_http_redirect_from_a_https_only_store_goes_to_obstore() -> None:
    hop = next_hop(
        "https://h:443",
        "/a",
        "http://other/a",
        1,
        status=302,
        region=None,
        home=("h", 443),
        signed_region=None,
        allow_http=False,
    )
    assert hop is None


def test_signed_redirects_are_signed_again_only_for_aws_or_the_same_host() -> None:
    def hop(location: str, region: str | None = None):
        return next_hop(
            "https://s3.us-east-1.amazonaws.com:443",
            "/bkt/k",
            location,
            1,
            status=307,
            region=region,
            home=("s3.us-east-1.amazonaws.com", 443),
            signed_region="us-east-1",
            allow_http=False,
        )

    same = hop("/bkt/k?x-id=GetObject")
    assert same is not None and same.region is None and (same.path, same.query) == ("/bkt/k", "x-id=GetObject")
    young = hop("https://bkt.s3-eu-west-1.amazonaws.com/k")  # S3's 307 for a bucket whose DNS is not out yet
    assert young is not None and (young.host, young.region) == ("bkt.s3-eu-west-1.amazonaws.com", "eu-west-1")
    named = hop("https://bkt.s3.amazonaws.com/k", region="ap-south-1")  # the answer's x-amz-bucket-region wins
    assert named is not None and named.region == "ap-south-1"
    assert hop("https://cdn.example.com/k") is None  # no credentials go there: obstore's client follows it
    assert region_of("s3.dualstack.eu-central-1.amazonaws.com") == "eu-central-1"
    assert region_of("bkt.s3.amazonaws.com") == "us-east-1" and region_of("example.com") is None
    with pytest.raises(RedirectError, match="more than"):
        next_hop(
            "https://h:443",
            "/a",
            "/b",
            MAX_REDIRECTS + 1,
            status=302,
            region=None,
            home=("h", 443),
            signed_region=None,
            allow_http=False,
        )
