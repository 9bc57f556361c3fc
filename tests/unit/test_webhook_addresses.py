"""Where a webhook may go (webhooks/addresses.py): every address that is not
public is refused, also when an IPv6 form carries it, unless an allowed
network holds it; a URL must be an absolute https URL without credentials."""

from __future__ import annotations

import ipaddress

import pytest

from kandev_es.errors import InvalidWebhookUrl, WebhookAddressRefused
from kandev_es.webhooks.addresses import NetworkPolicy, parse_url

REFUSED = [
    "127.0.0.1",
    "10.0.0.1",
    "172.16.5.4",
    "192.168.1.1",
    "169.254.169.254",
    "100.64.0.1",
    "100.100.100.200",
    "0.0.0.0",
    "224.0.0.1",
    "239.255.255.250",
    "255.255.255.255",
    "192.0.2.10",
    "198.18.0.1",
    "::1",
    "::",
    "fe80::1",
    "fd00:ec2::254",
    "ff02::1",
    "::ffff:127.0.0.1",
    "::ffff:10.0.0.1",
    "64:ff9b::a9fe:a9fe",
    "2002:7f00:1::",
    "2001:0:4136:e378:8000:63bf:f5ff:fffe",  # Teredo carrying 10.0.0.1
]
PUBLIC = ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888", "::ffff:8.8.8.8"]


@pytest.mark.parametrize("address", REFUSED)
def test_addresses_that_are_not_public_are_refused(address):
    policy = NetworkPolicy()
    assert not policy.permits(ipaddress.ip_address(address))
    with pytest.raises(WebhookAddressRefused):
        policy.check([address])


@pytest.mark.parametrize("address", PUBLIC)
def test_public_addresses_are_permitted(address):
    assert NetworkPolicy().check([address]) == [address]


def test_an_allowed_network_lets_its_addresses_through_and_no_other():
    policy = NetworkPolicy.from_settings(["127.0.0.0/8", "10.1.0.0/16"], allow_http=False)
    assert policy.check(["127.0.0.1", "::ffff:127.0.0.2", "10.1.2.3"])
    with pytest.raises(WebhookAddressRefused):
        policy.check(["10.2.0.1"])
    with pytest.raises(WebhookAddressRefused):  # one refused address refuses the name
        policy.check(["8.8.8.8", "169.254.169.254"])
    with pytest.raises(InvalidWebhookUrl):
        NetworkPolicy.from_settings(["not-a-network"], allow_http=False)


@pytest.mark.parametrize(
    "url",
    [
        "",
        "example.com/hook",
        "http://example.com/",
        "ftp://example.com/",
        "https:///path",
        "https://u:p@example.com/",
        "https://example.com/#frag",
        "https://exa mple.com/",
        "https://example.com:99999/",
        "https://example.com/\n",
        "https://" + "a" * 2100,
    ],
)
def test_urls_that_are_not_absolute_https_urls_are_refused(url):
    with pytest.raises(InvalidWebhookUrl):
        parse_url(url, NetworkPolicy())


def test_http_only_when_allowed_and_ports_default_by_scheme():
    assert parse_url("https://example.com/x", NetworkPolicy()).port == 443
    allowed = NetworkPolicy(allow_http=True)
    assert parse_url("http://example.com/x", allowed).port == 80
    assert parse_url("http://example.com:8080/x", allowed).port == 8080
