"""Where a webhook may be sent (SSRF: docs/webhooks.md).

A URL is checked when it is subscribed (``check_url``) and every address it
resolves to is checked again when a delivery connects (``NetworkPolicy.check``
from the deliverer's own connect, webhooks/transport.py), so a name that
resolved to a public address at subscribe time and to 127.0.0.1 later (DNS
rebinding) is refused at the connection it would have made.

Refused unless inside one of KANDEV_WEBHOOK_ALLOW_NETWORKS: every address
that is not globally routable (loopback, RFC 1918 private, link-local and so
the cloud metadata address 169.254.169.254, CGNAT 100.64/10 and so Alibaba's
100.100.100.200, unique-local IPv6 and so AWS's fd00:ec2::254, unspecified,
reserved, documentation ranges), multicast, and an IPv6 address carrying a
refused IPv4 one (IPv4-mapped, 6to4, Teredo, NAT64).
"""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from urllib.parse import urlsplit

from kandev_es.errors import InvalidWebhookUrl, WebhookAddressRefused

Address = ipaddress.IPv4Address | ipaddress.IPv6Address
Network = ipaddress.IPv4Network | ipaddress.IPv6Network
MAX_URL = 2048
NAT64 = ipaddress.IPv6Network("64:ff9b::/96")


def embedded_ipv4(address: Address) -> ipaddress.IPv4Address | None:
    """The IPv4 address an IPv6 one carries (mapped, 6to4, Teredo, NAT64)."""
    if isinstance(address, ipaddress.IPv4Address):
        return None
    if address.ipv4_mapped is not None:
        return address.ipv4_mapped
    if address.sixtofour is not None:
        return address.sixtofour
    if address.teredo is not None:
        return address.teredo[1]
    if address in NAT64:
        return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return None


def _public(address: Address) -> bool:
    if address.is_multicast or not address.is_global:
        return False
    inner = embedded_ipv4(address)
    return inner is None or _public(inner)


@dataclass(frozen=True)
class NetworkPolicy:
    """The addresses a delivery may connect to: public ones, and any inside
    an allowed network (how tests reach a receiver on 127.0.0.1)."""

    allowed: tuple[Network, ...] = ()
    allow_http: bool = False

    @classmethod
    def from_settings(cls, networks: Iterable[str], allow_http: bool) -> NetworkPolicy:
        parsed = []
        for text in networks:
            try:
                parsed.append(ipaddress.ip_network(text, strict=False))
            except ValueError:
                raise InvalidWebhookUrl(
                    f"KANDEV_WEBHOOK_ALLOW_NETWORKS: not a network: {text[:60]!r}"
                ) from None
        return cls(tuple(parsed), allow_http)

    def permits(self, address: Address) -> bool:
        if any(address in network for network in self.allowed):
            return True
        inner = embedded_ipv4(address)
        if inner is not None and any(inner in network for network in self.allowed):
            return True
        return _public(address)

    def check(self, addresses: Iterable[str]) -> list[str]:
        """``addresses`` (resolved) if every one is permitted; else refused."""
        found = list(addresses)
        for text in found:
            address = ipaddress.ip_address(text.split("%", 1)[0])
            if not self.permits(address):
                raise WebhookAddressRefused(
                    f"address {address} is not a public one (allow it with"
                    " KANDEV_WEBHOOK_ALLOW_NETWORKS)",
                    address=str(address),
                )
        if not found:
            raise InvalidWebhookUrl("the webhook host resolves to no address")
        return found


def resolve(host: str, port: int) -> list[str]:
    """Every address ``host`` resolves to now (an IP literal: itself)."""
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except (OSError, UnicodeError) as error:
        raise InvalidWebhookUrl(f"the webhook host does not resolve: {error}") from None
    return list(dict.fromkeys(str(info[4][0]) for info in infos))


@dataclass(frozen=True)
class Target:
    url: str
    scheme: str
    host: str
    port: int


def parse_url(url: object, policy: NetworkPolicy) -> Target:
    """A webhook URL's parts, or InvalidWebhookUrl saying what is wrong."""
    if not isinstance(url, str) or not url or len(url) > MAX_URL:
        raise InvalidWebhookUrl(f"url must be an absolute URL of at most {MAX_URL} characters")
    if any(ch.isspace() or ord(ch) < 32 for ch in url):
        raise InvalidWebhookUrl("url must not contain spaces or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as error:
        raise InvalidWebhookUrl(f"url is not a URL: {error}") from None
    schemes = ("https", "http") if policy.allow_http else ("https",)
    if parts.scheme not in schemes:
        allowed = " or ".join(schemes)
        raise InvalidWebhookUrl(f"url must be {allowed} (KANDEV_WEBHOOK_ALLOW_HTTP allows http)")
    if not parts.hostname:
        raise InvalidWebhookUrl("url has no host")
    if parts.username is not None or parts.password is not None:
        raise InvalidWebhookUrl("url must not carry credentials (the signature authenticates)")
    if parts.fragment:
        raise InvalidWebhookUrl("url must not have a fragment")
    default = 443 if parts.scheme == "https" else 80
    return Target(url, parts.scheme, parts.hostname, port or default)


def check_url(url: object, policy: NetworkPolicy) -> Target:
    """Subscribe time: a well-formed URL whose host resolves only to
    permitted addresses."""
    target = parse_url(url, policy)
    policy.check(resolve(target.host, target.port))
    return target
