"""The audience of a device's signed read (fedsketch.common.net.device_reads): the name a device
signs a read for, the names a coordinator's certificate proves, how they match; and the read
digest's domain, which no other signed kind shares. (Over gRPC: tests/service/test_read_access.py.)"""

from __future__ import annotations

import pytest

from fedsketch.common.net import signing
from fedsketch.common.net.device_reads import audience, names_audience
from fedsketch.common.net.tls import certificate_names, init_certs
from fedsketch.common.secagg import crypto as secagg_crypto
from fedsketch.common.secagg import wire as secagg_wire


@pytest.mark.parametrize(("coordinator", "expected"), [
    ("coord.example.org:7443", "coord.example.org"),
    ("Coord.Example.ORG.:7443", "coord.example.org"),
    ("10.0.0.5:7443,10.0.0.6:7443", "10.0.0.5"),  # shared coordinators: the list's first address
    ("[::1]:7443", "::1"),
    ("[2001:DB8:0:0::1]:7443,[2001:db8::2]:7443", "2001:db8::1"),
])
def test_a_read_is_signed_for_the_host_tls_verifies(coordinator, expected):
    assert audience(coordinator) == expected


def test_a_certificate_names_its_hosts_and_a_wildcard_covers_one_label(tmp_path):
    paths = init_certs(tmp_path, ["Coord.Example.org", "10.0.0.5", "::1", "*.fleet.example.org"])
    names = certificate_names(paths.server_cert)
    assert names == {"coord.example.org", "10.0.0.5", "::1", "*.fleet.example.org"}
    for ok in ("coord.example.org", "10.0.0.5", "::1", "a.fleet.example.org"):
        assert names_audience(names, ok)
    for other in ("example.org", "a.b.fleet.example.org", "fleet.example.org", ".fleet.example.org",
                  "10.0.0.6", "*.fleet.example.org", "*.fleet.example.org.evil",
                  "coord.example.org.evil"):
        assert not names_audience(names, other), other


def test_the_read_domain_is_no_other_kind_of_signature():
    """Every digest a device signs starts with its kind's domain; the read's is no prefix of
    another kind's, nor another's of it, so no read signature verifies as any other kind."""
    others = [signing.DOMAIN, signing.REGISTRATION_DOMAIN, signing.LEAVE_DOMAIN,
              signing.REFUSAL_DOMAIN, secagg_wire.DOMAIN, secagg_crypto.DOMAIN_PREFIX + b"advert",
              secagg_crypto.DOMAIN_PREFIX + b"survivors", b"fedsketch/read/v1"]
    for other in others:
        assert not other.startswith(signing.READ_DOMAIN) and not signing.READ_DOMAIN.startswith(other)
