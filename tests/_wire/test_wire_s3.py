"""S3 through each client: where requests go and as whom (obstore is the oracle), signatures checked by moto.

moto's server here runs with IAM on (``start_s3_server(check_signatures=True)``): a request whose
SigV4 signature does not verify is refused, so every byte read proves its
signature. Addressing (path or virtual-hosted style, with an endpoint) is
compared request line by request line with what obstore sends to a
scripted emulator.
"""

from __future__ import annotations

import asyncio
import socket

import obstore.store
import pytest
from scripted import WIRE_CLIENTS, read_through
from servers import S3Server
from zarr.abc.store import RangeByteRequest

from insitubatch._wire.engine_client import NativeBackend, native_backend
from insitubatch.testing.emulator import Request, answer

BUCKET = "wire-signed"
BLOBS = {f"d/k{i}": bytes((i * 7 + j) % 251 for j in range(300 + 97 * i)) for i in range(5)}
ODD_KEY = "d/k~1.0 x"


@pytest.fixture(autouse=True)
def _clean(no_aws_environment: None) -> None:
    pass


@pytest.fixture(scope="module")
def bucket(signed_s3: S3Server) -> str:
    s3 = signed_s3.boto3_client()
    s3.create_bucket(Bucket=BUCKET)
    for key, blob in {**BLOBS, ODD_KEY: b"odd"}.items():
        s3.put_object(Bucket=BUCKET, Key=f"a b/pre/{key}", Body=blob)
    return BUCKET


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_signed_reads_verify_and_give_the_same_bytes(signed_s3: S3Server, bucket: str, client: str) -> None:
    url = f"s3://{bucket}/a b/pre"
    for key, blob in BLOBS.items():
        assert read_through(client, url, key, **signed_s3.client_options()) == blob
    assert (
        read_through(client, url, "d/k3", RangeByteRequest(7, 99), **signed_s3.client_options()) == BLOBS["d/k3"][7:99]
    )
    assert read_through(client, url, ODD_KEY, **signed_s3.client_options()) == b"odd"
    assert read_through(client, url, "d/none", **signed_s3.client_options()) is None
    wrong = read_through(client, url, "d/k1", **signed_s3.client_options(secret_access_key="not-the-secret"))
    assert isinstance(wrong, Exception) and "403" in str(wrong) or "Permission" in type(wrong).__name__, wrong


def _forward(head: bytes, port: int) -> bytes:
    """``head`` (a GET) sent to loopback ``port`` as it is; the whole answer back."""
    with socket.create_connection(("127.0.0.1", port), timeout=10) as upstream:
        upstream.sendall(head)
        data = b""
        while b"\r\n\r\n" not in data:
            data += upstream.recv(65536)
        top, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(v) for k, _, v in (ln.partition(b":") for ln in top.split(b"\r\n")) if k.lower() == b"content-length"
        )
        while len(body) < length:
            body += upstream.recv(65536)
    return top + b"\r\n\r\n" + body


@pytest.mark.parametrize("client", WIRE_CLIENTS)
def test_a_redirect_on_the_same_host_is_signed_again(scripted, signed_s3: S3Server, bucket: str, client) -> None:
    """S3 answers 307 to the same path with a query: the engine signs the new request (moto checks it)."""
    moto_port = int(signed_s3.endpoint.rsplit(":", 1)[1])

    def script(request: Request) -> bytes:
        if "?" not in request.target:
            return answer(307, Location=f"{request.target}?x-id=GetObject")
        return _forward(
            request.head, moto_port
        )  # to moto as it came, Host header and signature as the client sent them

    front = scripted(script)
    options = signed_s3.client_options(endpoint=f"http://127.0.0.1:{front.port}")
    got = read_through(client, f"s3://{bucket}/a b/pre", "d/k2", RangeByteRequest(3, 50), **options)
    if client == "engine":
        assert got == BLOBS["d/k2"][3:50]
    else:  # obstore's client resends the old signature (for the path without the query): moto refuses it
        assert isinstance(got, Exception) and "403" in str(got) or "Permission" in type(got).__name__, got


def test_a_signed_redirect_to_a_host_the_engine_cannot_sign_for_goes_to_obstore(scripted) -> None:
    """No credential leaves for a host that is not AWS's: the read is obstore's, which follows it unsigned."""
    body = b"served elsewhere"
    elsewhere = scripted(lambda r: answer(206, body, Content_Range=f"bytes 0-{len(body) - 1}/{len(body)}"))
    front = scripted(lambda r: answer(307, Location=elsewhere.url_for(r.path)))
    options = {"endpoint": f"http://127.0.0.1:{front.port}", "allow_http": True, "region": "us-east-1"}
    options.update(access_key_id="AKX", secret_access_key="SKX")
    assert read_through("engine", "s3://bkt/p", "k", RangeByteRequest(0, len(body)), **options) == body
    agents = [r.headers["user-agent"].split("/")[0] for r in front.requests]
    assert agents == ["insitubatch", "object_store"]  # the engine asked, then handed the read to obstore
    assert [r.headers["user-agent"].split("/")[0] for r in elsewhere.requests] == ["object_store"]
    assert "authorization" not in elsewhere.requests[0].headers


def _captured(heads: list[Request]):
    def answers(request: Request) -> bytes:
        heads.append(request)
        return answer(206, b"body", Content_Range="bytes 0-3/100")

    return answers


def _who(request: Request) -> tuple[str, str, str, str]:
    credential = request.headers.get("authorization", "").split("Credential=")[-1].split(",")[0]
    scope = credential.split("/", 1)[0] + "/" + "/".join(credential.split("/")[2:])  # the key and scope, not the day
    return request.target, request.headers["host"], scope, request.headers.get("x-amz-security-token", "")


@pytest.mark.parametrize("style", ["path", "virtual-hosted"])
@pytest.mark.parametrize("from_env", [False, True])
def test_s3_requests_go_where_and_as_whom_obstore_sends_them(scripted, monkeypatch, from_env: bool, style) -> None:
    """obstore is the oracle: the same store, the same key, the same path, host, credential scope and token.

    Virtual-hosted style with an endpoint: obstore takes the endpoint as the
    bucket's own (the bucket is not added to its host or path).
    """
    heads: list[Request] = []
    server = scripted(_captured(heads))
    endpoint = f"http://127.0.0.1:{server.port}"
    settings = {"access_key_id": "AKX", "secret_access_key": "SKX", "token": "TKX", "region": "ap-south-1"}
    virtual = style == "virtual-hosted"
    if from_env:
        env = {"AWS_ACCESS_KEY_ID": "AKX", "AWS_SECRET_ACCESS_KEY": "SKX", "AWS_SESSION_TOKEN": "TKX"}
        env.update(AWS_DEFAULT_REGION="ap-south-1", AWS_ENDPOINT_URL=endpoint, AWS_ALLOW_HTTP="true")
        if virtual:
            env["AWS_VIRTUAL_HOSTED_STYLE_REQUEST"] = "true"
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        raw = obstore.store.S3Store("my-bkt", prefix="a b/pre")
    else:
        extra = {"virtual_hosted_style_request": True} if virtual else {}
        raw = obstore.store.S3Store(
            "my-bkt", prefix="a b/pre", endpoint=endpoint, client_options={"allow_http": True}, **settings, **extra
        )
    obstore.get_range(raw, "d/k~1.0", start=0, end=4)
    native = native_backend(raw, raw)
    assert native is not None

    async def ours() -> bytes:
        return bytes(await native.request("d/k~1.0", RangeByteRequest(0, 4)))

    assert asyncio.run(ours()) == b"body"
    theirs, mine = (_who(h) for h in heads)
    assert mine == theirs and theirs[2].startswith("AKX/ap-south-1/s3/aws4_request") and theirs[3] == "TKX"
    assert theirs[0] == ("/a%20b/pre/d/k~1.0" if virtual else "/my-bkt/a%20b/pre/d/k~1.0")
    assert theirs[1] == f"127.0.0.1:{server.port}"


def test_which_stores_the_engine_reads_itself(monkeypatch: pytest.MonkeyPatch) -> None:
    def backend(raw):
        return native_backend(raw, raw)

    http = obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x", client_options={"allow_http": True})
    assert isinstance(backend(http), NativeBackend)
    assert backend(obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x")) is None  # obstore refuses http
    headers = {"allow_http": True, "default_headers": {"x-a": "b"}}
    assert backend(obstore.store.HTTPStore.from_url("http://127.0.0.1:9/x", client_options=headers)) is None
    anonymous = {"endpoint": "http://127.0.0.1:9", "region": "us-east-1", "skip_signature": True}
    s3 = obstore.store.S3Store("b", prefix="p/q", client_options={"allow_http": True}, **anonymous)
    native = backend(s3)
    assert isinstance(native, NativeBackend) and native.base == "/b/p/q" and native.signer is None
    keyed = obstore.store.S3Store("b", region="eu-west-1", access_key_id="AK", secret_access_key="SK")
    native = backend(keyed)
    assert isinstance(native, NativeBackend) and native.host == "s3.eu-west-1.amazonaws.com"
    assert native.signer is not None and native.signer.region == "eu-west-1" and native.base == "/b"
    virtual = backend(
        obstore.store.S3Store(
            "b",
            region="eu-west-1",
            virtual_hosted_style_request=True,
            **{"access_key_id": "AK", "secret_access_key": "SK"},
        )
    )
    assert virtual is not None and (virtual.host, virtual.base) == ("b.s3.eu-west-1.amazonaws.com", "")
    assert backend(obstore.store.S3Store("b", region="eu-west-1")) is None  # credentials from the environment
    assert backend(obstore.store.S3Store("b", skip_signature=True)) is None  # the region from the environment
    monkeypatch.setenv("HTTPS_PROXY", "http://127.0.0.1:3128")
    assert backend(keyed) is None  # a proxy: obstore's client knows how
    monkeypatch.delenv("HTTPS_PROXY")
    monkeypatch.setenv("AWS_REQUEST_PAYER", "true")
    assert backend(keyed) is None  # a header this client does not send
    monkeypatch.delenv("AWS_REQUEST_PAYER")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "ENVKEY")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "ENVSECRET")
    monkeypatch.setenv("AWS_SESSION_TOKEN", "ENVTOKEN")
    from_env = backend(obstore.store.S3Store("b", region="eu-west-1"))
    assert isinstance(from_env, NativeBackend) and from_env.signer is not None
    assert (from_env.signer.access_key_id, from_env.signer.token) == ("ENVKEY", "ENVTOKEN")
    keyed_env = backend(keyed)
    assert keyed_env is not None and keyed_env.signer is not None
    assert (keyed_env.signer.access_key_id, keyed_env.signer.token) == ("AK", "ENVTOKEN")  # the config's key wins
    monkeypatch.setenv("AWS_REGION", "us-west-2")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-2")
    assert backend(obstore.store.S3Store("b")) is None  # which of the two obstore takes is not defined
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    regional = backend(obstore.store.S3Store("b"))
    assert regional is not None and regional.signer is not None and regional.signer.region == "us-west-2"
