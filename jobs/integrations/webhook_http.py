"""The webhook POST, with the receiver's address checked (docs/webhooks.md#addresses).

A receiver's name is resolved once per attempt, every address it resolves to is
checked, and the connection goes to the checked address, the name kept for the Host
header and TLS (SNI and certificate check): a name cannot resolve to a public address
for the check and to 127.0.0.1 for the connection (DNS rebinding). Loopback,
private, link-local, CGNAT (100.64.0.0/10), unspecified, multicast and reserved
addresses are refused, IPv4-mapped IPv6 by the IPv4 address inside, unless
JOBOPS_WEBHOOK_ALLOW_PRIVATE is on. No redirect is followed; the answer is read up to
`RESPONSE_CAP` bytes.
"""

from __future__ import annotations

import ipaddress
import socket
import time
from dataclasses import dataclass
from urllib.parse import urlsplit

import certifi
import urllib3
from django.conf import settings

# What an attempt keeps of the answer, and all it reads of it.
RESPONSE_CAP = 1024
CGNAT = ipaddress.ip_network("100.64.0.0/10")
SCHEMES = {"http": 80, "https": 443}


class AddressRefused(Exception):
    """The URL, or an address its name resolves to, may not be delivered to."""


@dataclass(frozen=True)
class Answer:
    """One POST's outcome: the status (None: no answer), the start of the answer or
    the error, and how long it took."""

    status: int | None
    text: str
    latency_ms: int


def address_refusal(ip: ipaddress.IPv4Address | ipaddress.IPv6Address) -> str | None:
    """Why `ip` may not be a receiver, or None."""
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    if isinstance(ip, ipaddress.IPv4Address) and ip in CGNAT:
        return "a shared (CGNAT) address"
    for flag, what in (
        ("is_unspecified", "an unspecified address"),
        ("is_loopback", "a loopback address"),
        ("is_link_local", "a link-local address"),
        ("is_private", "a private address"),
        ("is_multicast", "a multicast address"),
        ("is_reserved", "a reserved address"),
    ):
        if getattr(ip, flag):
            return what
    if not ip.is_global:
        return "not a public address"
    return None


def literal_address(host: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    """`host` as an IP address when it is written as one, in any form the resolver
    takes (127.1, 2130706433, 0x7f.1, [::1]); None for a name."""
    host = host.strip("[]")
    try:
        return ipaddress.ip_address(host)
    except ValueError:
        pass
    try:
        return ipaddress.IPv4Address(socket.inet_aton(host))  # the legacy numeric forms
    except OSError:
        return None


def url_refusal(url: str, *, allow_private: bool | None = None) -> str | None:
    """Why `url` cannot be a receiver as it is written (scheme, host, a literal
    address that is not public), or None. Names are checked at each delivery."""
    allow = settings.JOBOPS_WEBHOOK_ALLOW_PRIVATE if allow_private is None else allow_private
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError:
        return "not a URL"
    if parts.scheme not in SCHEMES:
        return "the scheme must be http or https"
    host = parts.hostname or ""
    if not host:
        return "the URL names no host"
    if parts.username or parts.password:
        return "credentials in the URL are not accepted (sign requests instead)"
    if port == 0:
        return "port 0"
    if allow:
        return None
    if host == "localhost" or host.endswith(".localhost"):
        return "localhost is a loopback address"
    ip = literal_address(host)
    if ip is not None:
        refusal = address_refusal(ip)
        if refusal:
            return f"{host} is {refusal}"
    return None


def resolve(host: str, port: int) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address to connect to: the first `host` resolves to, once every address it
    resolves to passed the check (AddressRefused else)."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise AddressRefused(f"{host} does not resolve: {exc}") from None
    addresses = [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in infos]
    if not addresses:
        raise AddressRefused(f"{host} resolves to no address")
    if not settings.JOBOPS_WEBHOOK_ALLOW_PRIVATE:
        for ip in addresses:
            refusal = address_refusal(ip)
            if refusal:
                raise AddressRefused(f"{host} resolves to {ip}, {refusal}")
    return addresses[0]


def webhook_post(url: str, *, body: bytes, headers: dict[str, str], timeout: float) -> Answer:
    """POST `body` to `url` at the checked address; never raises for the receiver's
    failures (the Answer says them), AddressRefused included as an answer-less one."""
    started = time.monotonic()

    def answer(status: int | None, text: str) -> Answer:
        return Answer(status, text[:RESPONSE_CAP], int((time.monotonic() - started) * 1000))

    refusal = url_refusal(url)
    if refusal:
        return answer(None, f"address refused: {refusal}")
    parts = urlsplit(url)
    host = parts.hostname or ""
    port = parts.port or SCHEMES[parts.scheme]
    try:
        ip = resolve(host, port)
    except AddressRefused as exc:
        return answer(None, f"address refused: {exc}")
    path = (parts.path or "/") + (f"?{parts.query}" if parts.query else "")
    host_header = parts.netloc.rpartition("@")[2]
    limits = urllib3.Timeout(connect=timeout, read=timeout)
    pool: urllib3.HTTPConnectionPool
    if parts.scheme == "https":
        pool = urllib3.HTTPSConnectionPool(
            str(ip),
            port,
            timeout=limits,
            retries=False,
            maxsize=1,
            cert_reqs="CERT_REQUIRED",
            ca_certs=certifi.where(),
            server_hostname=host,
            assert_hostname=host,
        )
    else:
        pool = urllib3.HTTPConnectionPool(str(ip), port, timeout=limits, retries=False, maxsize=1)
    try:
        response = pool.urlopen(
            "POST",
            path,
            body=body,
            headers={**headers, "Host": host_header},
            redirect=False,
            retries=False,
            preload_content=False,
            assert_same_host=False,
        )
        try:
            text = response.read(RESPONSE_CAP, decode_content=False).decode("utf-8", "replace")
        finally:
            response.release_conn()
            response.close()
        return answer(response.status, text)
    except urllib3.exceptions.HTTPError as exc:
        return answer(None, f"{type(exc).__name__}: {exc}")
    except OSError as exc:
        return answer(None, f"{type(exc).__name__}: {exc}")
    finally:
        pool.close()
