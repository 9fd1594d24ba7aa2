"""Certificates for TLS stand-ins: a CA, a server certificate for 127.0.0.1 and a client certificate.

What kind's kubeconfig holds: the cluster's CA, and a client certificate (``kubernetes-admin``,
group ``system:masters``) signed by it. Needs ``cryptography`` (a test dependency, imported here
only). PEM text throughout, as a kubeconfig carries it (base64 of it in ``*-data``).
"""

from __future__ import annotations

import datetime
import ipaddress

from attrs import frozen
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID


@frozen
class KeyPair:
    cert_pem: str
    key_pem: str


@frozen
class TestPki:
    ca: KeyPair
    server: KeyPair
    client: KeyPair


def _make(
    name: str, issuer: tuple[ec.EllipticCurvePrivateKey, x509.Name] | None, *, ca: bool = False, ip: str | None = None
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, name)])
    signing_key, issuer_name = issuer if issuer else (key, subject)
    now = datetime.datetime.now(datetime.UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=5))
        .not_valid_after(now + datetime.timedelta(hours=2))
        .add_extension(x509.BasicConstraints(ca=ca, path_length=None), critical=True)
    )
    if ip:
        builder = builder.add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address(ip))]), critical=False)
    return key, builder.sign(signing_key, hashes.SHA256())


def _pair(key: ec.EllipticCurvePrivateKey, cert: x509.Certificate) -> KeyPair:
    return KeyPair(
        cert.public_bytes(serialization.Encoding.PEM).decode(),
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()).decode(),
    )


def make_pki(server_ip: str = "127.0.0.1", client_name: str = "kubernetes-admin") -> TestPki:
    """A fresh CA with a server certificate for ``server_ip`` and a client certificate, all signed by it."""
    ca_key, ca_cert = _make("cdiplug test CA", None, ca=True)
    server = _make("apiserver", (ca_key, ca_cert.subject), ip=server_ip)
    client = _make(client_name, (ca_key, ca_cert.subject))
    return TestPki(_pair(ca_key, ca_cert), _pair(*server), _pair(*client))
