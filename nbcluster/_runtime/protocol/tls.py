"""TLS for every connection of a cluster: certificates, and credentials for gRPC and sockets.

The model is Dask's and Ray's: one certificate authority per cluster, and every process
(head, node managers, workers, drivers) presents a certificate signed by it and accepts
only peers that do too (mutual TLS). The cluster token is still checked on every call;
TLS adds privacy on the wire and keeps out peers without the cluster's certificate.

- ``nbcluster start --head --tls`` makes a fresh CA and one cluster certificate in the
  session directory (:func:`make_cluster_certificates`); hosts that join get the same three
  files (like the token file). Given files (``--tls-ca``, ``--tls-cert``, ``--tls-key``)
  work the same way, e.g. certificates from an organisation's own CA.
- Every process reads :class:`TlsSettings` from the environment (``NBCLUSTER_TLS_CA_CERT``,
  ``NBCLUSTER_TLS_CERT``, ``NBCLUSTER_TLS_KEY``; children inherit them).
  :func:`server_credentials` / :func:`channel_credentials` turn them into gRPC credentials
  (``protocol/rpc.py`` binds and connects with them), :func:`ssl_context` into an
  ``ssl.SSLContext`` for raw sockets (the data plane).
- Peers are verified against the CA, and the name checked is the certificate's cluster name
  (``nbcluster`` by default, sent as the TLS server name), not the host's address: nodes
  join from any address with the same certificate.
- ``NBCLUSTER_REQUIRE_ENCRYPTION=1`` fails closed: without TLS settings no server starts and
  no channel opens (:class:`EncryptionRequiredError`, a ``ConnectionError`` saying
  "encryption required"); with them, servers listen only with TLS, so a plain client's
  handshake fails.

Certificates are made with the ``cryptography`` package when it can be imported, else with
the ``openssl`` command (run without a shell). Private keys are written with mode 0600 from
the first byte.
"""

from __future__ import annotations

import dataclasses
import datetime
import ipaddress
import os
import shutil
import ssl
import subprocess
import tempfile
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import grpc

__all__ = [
    "CA_FILE",
    "CA_KEY_FILE",
    "CERT_FILE",
    "KEY_FILE",
    "DEFAULT_SERVER_NAME",
    "EncryptionRequiredError",
    "TlsSettings",
    "channel_credentials",
    "channel_options",
    "current",
    "make_cluster_certificates",
    "server_credentials",
    "settings",
    "ssl_context",
]

CA_FILE, CA_KEY_FILE, CERT_FILE, KEY_FILE = "ca.pem", "ca-key.pem", "cert.pem", "key.pem"
DEFAULT_SERVER_NAME = "nbcluster"
_ENV = {
    "ca_file": "NBCLUSTER_TLS_CA_CERT",
    "cert_file": "NBCLUSTER_TLS_CERT",
    "key_file": "NBCLUSTER_TLS_KEY",
    "server_name": "NBCLUSTER_TLS_SERVER_NAME",
}
_REQUIRE = "NBCLUSTER_REQUIRE_ENCRYPTION"
_TRUE = ("1", "true", "yes", "on")


class EncryptionRequiredError(ConnectionError):
    """``require_encryption`` is on but this process has no TLS settings."""


@dataclasses.dataclass(frozen=True)
class TlsSettings:
    """Where this process's TLS files are (all three, or TLS is off)."""

    ca_file: str
    cert_file: str
    key_file: str
    server_name: str = DEFAULT_SERVER_NAME

    @classmethod
    def from_dir(cls, directory: str | os.PathLike[str]) -> TlsSettings:
        """The files :func:`make_cluster_certificates` wrote into ``directory``."""
        d = Path(directory)
        return cls(str(d / CA_FILE), str(d / CERT_FILE), str(d / KEY_FILE))

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> TlsSettings | None:
        """Read ``NBCLUSTER_TLS_*``; None when TLS is off. Half a configuration is an error."""
        env = os.environ if environ is None else environ
        given = {k: env.get(var, "") for k, var in _ENV.items() if k != "server_name"}
        if not any(given.values()):
            return None
        missing = [_ENV[k] for k, v in given.items() if not v]
        if missing:
            raise ValueError(
                f"TLS needs a CA certificate, a certificate and its key; {', '.join(missing)} "
                f"{'is' if len(missing) == 1 else 'are'} not set"
            )
        for k, path in given.items():
            if not os.path.isfile(path):
                raise FileNotFoundError(f"{_ENV[k]}={path}: no such file")
        name = env.get(_ENV["server_name"], "") or DEFAULT_SERVER_NAME
        return cls(server_name=name, **given)

    def env(self) -> dict[str, str]:
        """The variables that hand these settings to child processes."""
        return {var: str(getattr(self, k)) for k, var in _ENV.items()}

    def read(self) -> tuple[bytes, bytes, bytes]:
        """(CA certificate, certificate chain, private key) as PEM bytes."""
        return (
            Path(self.ca_file).read_bytes(),
            Path(self.cert_file).read_bytes(),
            Path(self.key_file).read_bytes(),
        )


def require_encryption(environ: Mapping[str, str] | None = None) -> bool:
    """Whether ``NBCLUSTER_REQUIRE_ENCRYPTION`` asks to fail closed."""
    env = os.environ if environ is None else environ
    return env.get(_REQUIRE, "").strip().lower() in _TRUE


def settings(environ: Mapping[str, str] | None = None) -> TlsSettings | None:
    """This process's TLS settings (None: plain), enforcing ``require_encryption``."""
    found = TlsSettings.from_env(environ)
    if found is None and require_encryption(environ):
        raise EncryptionRequiredError(
            f"encryption required ({_REQUIRE} is set) but TLS is not configured: set "
            f"{_ENV['ca_file']}, {_ENV['cert_file']} and {_ENV['key_file']} (the files "
            "`nbcluster start --head --tls` prints), or unset it"
        )
    return found


_cache: dict[tuple[str, ...], TlsSettings | None] = {}


def current() -> TlsSettings | None:
    """:func:`settings` of ``os.environ``, cached while those variables stay the same."""
    key = tuple(os.environ.get(v, "") for v in (*_ENV.values(), _REQUIRE))
    if key not in _cache:
        _cache.clear()
        _cache[key] = settings()
    return _cache[key]


# ----------------------------------------------------------------------------- gRPC


def server_credentials(tls: TlsSettings) -> grpc.ServerCredentials:
    """Server side: present the cluster certificate and demand one from every client."""
    ca, cert, key = tls.read()
    return grpc.ssl_server_credentials(
        [(key, cert)], root_certificates=ca, require_client_auth=True
    )


def channel_credentials(tls: TlsSettings) -> grpc.ChannelCredentials:
    """Client side: trust only the cluster CA, and present the cluster certificate."""
    ca, cert, key = tls.read()
    return grpc.ssl_channel_credentials(
        root_certificates=ca, private_key=key, certificate_chain=cert
    )


def channel_options(tls: TlsSettings) -> list[tuple[str, Any]]:
    """Check the peer's certificate against the cluster name, not the address dialled."""
    return [("grpc.ssl_target_name_override", tls.server_name)]


# ----------------------------------------------------------------------------- sockets


def ssl_context(tls: TlsSettings, *, server: bool) -> ssl.SSLContext:
    """An ``ssl.SSLContext`` for raw sockets with the same rules as the gRPC credentials.

    Clients wrap with ``server_hostname=tls.server_name``.
    """
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER if server else ssl.PROTOCOL_TLS_CLIENT)
    ctx.minimum_version = ssl.TLSVersion.TLSv1_2
    ctx.load_cert_chain(tls.cert_file, tls.key_file)
    ctx.load_verify_locations(cafile=tls.ca_file)
    ctx.verify_mode = ssl.CERT_REQUIRED  # both ways: mutual TLS
    return ctx


# ----------------------------------------------------------------------------- certificates


def make_cluster_certificates(
    directory: str | os.PathLike[str],
    *,
    server_name: str = DEFAULT_SERVER_NAME,
    hosts: Sequence[str] = (),
    days: int = 365,
    backend: str = "auto",
) -> TlsSettings:
    """Make a fresh CA and one cluster certificate (for servers and clients) in ``directory``.

    The certificate names ``server_name`` (what peers check), ``localhost`` and any
    ``hosts`` (addresses or names). Keys get mode 0600. ``backend`` is ``"cryptography"``,
    ``"openssl"`` or ``"auto"`` (the package when it imports, else the command).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True, mode=0o700)
    names = [server_name, "localhost", "127.0.0.1", "::1", *hosts]
    if backend == "auto":
        try:
            import cryptography  # noqa: F401
        except ImportError:
            backend = "openssl"
        else:
            backend = "cryptography"
    if backend == "cryptography":
        _make_with_cryptography(out, server_name, names, days)
    elif backend == "openssl":
        _make_with_openssl(out, server_name, names, days)
    else:
        raise ValueError(f"backend must be 'auto', 'cryptography' or 'openssl', not {backend!r}")
    tls = TlsSettings.from_dir(out)
    return dataclasses.replace(tls, server_name=server_name)


def _write_private(path: Path, data: bytes) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    try:
        os.fchmod(fd, 0o600)
        os.write(fd, data)
    finally:
        os.close(fd)


def _san_entries(names: Sequence[str]) -> list[tuple[str, str]]:
    """("IP", "10.0.0.1") or ("DNS", "name") for each distinct name."""
    out: list[tuple[str, str]] = []
    for n in dict.fromkeys(names):
        try:
            out.append(("IP", str(ipaddress.ip_address(n.strip("[]")))))
        except ValueError:
            out.append(("DNS", n))
    return out


def _make_with_cryptography(out: Path, server_name: str, names: Sequence[str], days: int) -> None:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

    now = datetime.datetime.now(datetime.UTC)
    start, end = now - datetime.timedelta(hours=1), now + datetime.timedelta(days=days)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name(
        [x509.NameAttribute(NameOID.COMMON_NAME, f"{server_name} cluster CA {os.urandom(4).hex()}")]
    )
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
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
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    san: list[x509.GeneralName] = [
        x509.IPAddress(ipaddress.ip_address(v)) if kind == "IP" else x509.DNSName(v)
        for kind, v in _san_entries(names)
    ]
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, server_name)]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(end)
        .add_extension(x509.SubjectAlternativeName(san), critical=False)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.ExtendedKeyUsage(
                [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
            ),
            critical=False,
        )
        .sign(ca_key, hashes.SHA256())
    )
    pem = serialization.Encoding.PEM
    private = {
        "encoding": pem,
        "format": serialization.PrivateFormat.PKCS8,
        "encryption_algorithm": serialization.NoEncryption(),
    }
    _write_private(out / CA_KEY_FILE, ca_key.private_bytes(**private))
    _write_private(out / KEY_FILE, key.private_bytes(**private))
    (out / CA_FILE).write_bytes(ca.public_bytes(pem))
    (out / CERT_FILE).write_bytes(cert.public_bytes(pem))


def _make_with_openssl(out: Path, server_name: str, names: Sequence[str], days: int) -> None:
    openssl = shutil.which("openssl")
    if openssl is None:
        raise RuntimeError(
            "making TLS certificates needs the `cryptography` package or the `openssl` command; "
            "install one (pip install cryptography) or pass your own --tls-ca/--tls-cert/--tls-key"
        )
    san = ",".join(f"{kind}:{v}" for kind, v in _san_entries(names))
    # Work in a private directory (keys never readable by others, whatever the umask), then
    # move the results into place with the right modes.
    with tempfile.TemporaryDirectory(prefix="nbc-tls-") as tmp:
        t = Path(tmp)
        os.chmod(t, 0o700)
        ext = t / "leaf.cnf"
        ext.write_text(
            f"subjectAltName={san}\nbasicConstraints=critical,CA:FALSE\n"
            "extendedKeyUsage=serverAuth,clientAuth\nkeyUsage=digitalSignature\n"
        )
        ca_subj = f"/CN={server_name} cluster CA {os.urandom(4).hex()}"
        ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]
        steps = [
            [openssl, "req", "-x509", *ec, "-keyout", str(t / CA_KEY_FILE), "-out",
             str(t / CA_FILE), "-days", str(days), "-subj", ca_subj,
             "-addext", "basicConstraints=critical,CA:TRUE,pathlen:0",
             "-addext", "keyUsage=critical,keyCertSign,cRLSign"],
            [openssl, "req", *ec, "-keyout", str(t / KEY_FILE), "-out", str(t / "leaf.csr"),
             "-subj", f"/CN={server_name}"],
            [openssl, "x509", "-req", "-in", str(t / "leaf.csr"), "-CA", str(t / CA_FILE),
             "-CAkey", str(t / CA_KEY_FILE), "-set_serial", str(int.from_bytes(os.urandom(8), "big")),
             "-days", str(days), "-out", str(t / CERT_FILE), "-extfile", str(ext)],
        ]  # fmt: skip
        for argv in steps:
            r = subprocess.run(argv, capture_output=True, text=True, stdin=subprocess.DEVNULL)
            if r.returncode != 0:
                raise RuntimeError(f"openssl failed ({' '.join(argv[1:3])}): {r.stderr.strip()}")
        for name in (CA_KEY_FILE, KEY_FILE):
            _write_private(out / name, (t / name).read_bytes())
        for name in (CA_FILE, CERT_FILE):
            (out / name).write_bytes((t / name).read_bytes())
