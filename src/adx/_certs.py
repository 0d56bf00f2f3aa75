"""The cluster's certificate authority: mutual TLS between Coordinator, nodes and API (SEC-1).

A component's identity is its certificate's common name, ``<kind>:<name>`` (``node:n1``,
``coordinator:main``, ``api:main``). The CA key stays where ``adx certs init`` put it; each component gets
its own key and certificate signed by it.
"""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
import ssl
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from adx._fs import atomic_write_bytes
from adx.errors import ConflictError, InvalidInputError, NotFoundError

KINDS = ("node", "coordinator", "api")
_NAME = re.compile(r"^[a-z0-9][a-z0-9.-]{0,62}$")
CA_VALIDITY = dt.timedelta(days=3650)
LEAF_VALIDITY = dt.timedelta(days=825)


@dataclass(frozen=True)
class Identity:
    kind: str
    name: str

    @property
    def common_name(self) -> str:
        return f"{self.kind}:{self.name}"

    @classmethod
    def parse(cls, common_name: str) -> Identity:
        kind, _, name = common_name.partition(":")
        if kind not in KINDS or not _NAME.match(name):
            raise InvalidInputError("certificate", f"common name {common_name!r} is not an ADX identity")
        return cls(kind, name)


@dataclass(frozen=True)
class CertPaths:
    """Where one component's TLS material lives inside a certificate directory."""

    ca: Path
    cert: Path
    key: Path

    def read(self) -> tuple[bytes, bytes, bytes]:
        try:
            return self.ca.read_bytes(), self.cert.read_bytes(), self.key.read_bytes()
        except FileNotFoundError as exc:
            raise NotFoundError(f"TLS file {exc.filename} not found (create it with `adx certs issue`)") from None


def ca_paths(directory: Path) -> tuple[Path, Path]:
    return directory / "ca.pem", directory / "ca.key"


def component_paths(directory: Path, identity: Identity) -> CertPaths:
    base = f"{identity.kind}-{identity.name}"
    return CertPaths(directory / "ca.pem", directory / f"{base}.pem", directory / f"{base}.key")


def _key_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def init_ca(directory: Path, *, cluster: str = "adx") -> bool:
    """Create the cluster CA in ``directory`` unless one is there. Returns True if it was created."""
    cert_path, key_path = ca_paths(directory)
    if cert_path.exists() and key_path.exists():
        return False
    if cert_path.exists() or key_path.exists():
        raise ConflictError(f"{directory} holds half a CA (ca.pem or ca.key missing); refusing to overwrite")
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    key = ec.generate_private_key(ec.SECP256R1())
    subject = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, f"{cluster} cluster CA")])
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + CA_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=False,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(key, hashes.SHA256())
    )
    atomic_write_bytes(key_path, _key_pem(key), mode=0o600)
    atomic_write_bytes(cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return True


def issue(directory: Path, identity: Identity, hosts: list[str] | None = None) -> CertPaths:
    """Issue a key and certificate for ``identity``, valid for TLS server and client use on ``hosts``."""
    cert_path, key_path = ca_paths(directory)
    try:
        ca_cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
        ca_key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    except FileNotFoundError:
        raise NotFoundError(f"no CA in {directory}: run `adx certs init` first") from None
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise InvalidInputError("ca.key", "is not an EC private key")
    names: list[x509.GeneralName] = []
    for host in hosts or ["localhost", "127.0.0.1"]:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    key = ec.generate_private_key(ec.SECP256R1())
    now = dt.datetime.now(dt.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, identity.common_name)]))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(minutes=5))
        .not_valid_after(now + LEAF_VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.SubjectAlternativeName(names), critical=False)
        .add_extension(
            x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]), critical=False
        )
        .sign(ca_key, hashes.SHA256())
    )
    paths = component_paths(directory, identity)
    atomic_write_bytes(paths.key, _key_pem(key), mode=0o600)
    atomic_write_bytes(paths.cert, cert.public_bytes(serialization.Encoding.PEM), mode=0o644)
    return paths


def peer_identity(auth_context: Mapping[str, Iterable[bytes]]) -> Identity | None:
    """The verified identity of a gRPC peer from its auth context (None without a client certificate)."""
    names = list(auth_context.get("x509_common_name") or [])
    if len(names) != 1:
        return None
    try:
        return Identity.parse(names[0].decode())
    except InvalidInputError:
        return None


def client_ssl_context(paths: CertPaths) -> ssl.SSLContext:
    """An SSL context for HTTPS calls between components (e.g. Ingress -> Relay) with our certificate.

    Pass it as ``httpx.AsyncClient(verify=context)``: httpx's ``cert=`` argument is deprecated and does not
    present the client certificate reliably.
    """
    context = ssl.create_default_context(cafile=str(paths.ca))
    context.load_cert_chain(str(paths.cert), str(paths.key))
    return context
