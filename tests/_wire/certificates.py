"""A CA and server certificates made in the test (``cryptography``), for the HTTPS cases of the wire tests."""

from __future__ import annotations

import datetime
import ipaddress
import ssl
from dataclasses import dataclass
from pathlib import Path

from servers import LOOPBACK


@dataclass(frozen=True)
class Certificates:
    """A CA made in the test and server certificates it signed (PEM files)."""

    ca: Path
    good: tuple[Path, Path]  # for 127.0.0.1 and localhost: certificate chain, key
    wrong: tuple[Path, Path]  # for another name
    expired: tuple[Path, Path]  # for 127.0.0.1 and localhost, valid only until yesterday

    def server_context(self, which: tuple[Path, Path]) -> ssl.SSLContext:
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.load_cert_chain(*which)
        return context


def make_certificates(directory: Path) -> Certificates:
    """A CA and server certificates: for loopback's names, for another name (both valid for two days), expired."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    span = (now - datetime.timedelta(days=1), now + datetime.timedelta(days=2))

    def name(text: str) -> x509.Name:
        return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])

    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = (
        x509.CertificateBuilder()
        .subject_name(name("insitubatch test CA"))
        .issuer_name(name("insitubatch test CA"))
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(span[0])
        .not_valid_after(span[1])
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(True, False, False, False, False, True, True, False, False), critical=True
        )  # digital signature, certificate and CRL signing
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    directory.mkdir(parents=True, exist_ok=True)
    pem = ca.public_bytes(serialization.Encoding.PEM)
    (directory / "ca.pem").write_bytes(pem)

    def leaf(
        stem: str, names: list[str], valid: tuple[datetime.datetime, datetime.datetime] = span
    ) -> tuple[Path, Path]:
        key = ec.generate_private_key(ec.SECP256R1())
        alt = [x509.IPAddress(ipaddress.ip_address(n)) if n[0].isdigit() else x509.DNSName(n) for n in names]
        cert = (
            x509.CertificateBuilder()
            .subject_name(name(names[0]))
            .issuer_name(ca.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(valid[0])
            .not_valid_after(valid[1])
            .add_extension(x509.SubjectAlternativeName(alt), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
            .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
            .sign(ca_key, hashes.SHA256())
        )
        chain, private = directory / f"{stem}.pem", directory / f"{stem}.key"
        chain.write_bytes(cert.public_bytes(serialization.Encoding.PEM) + pem)
        private.write_bytes(
            key.private_bytes(
                serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
            )
        )
        return chain, private

    past = (now - datetime.timedelta(days=3), now - datetime.timedelta(days=1))
    return Certificates(
        directory / "ca.pem",
        leaf("good", [LOOPBACK, "localhost"]),
        leaf("wrong", ["elsewhere.test"]),
        leaf("expired", [LOOPBACK, "localhost"], past),
    )
