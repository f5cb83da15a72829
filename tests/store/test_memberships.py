"""Store.memberships, what decides which studies and results a device may read
(``server/service/reads.py``): run against every backend through the ``store`` fixture of
tests/conftest.py."""

from __future__ import annotations

from test_store import contribution, enroll, payload


def test_memberships_name_the_rosters_holding_a_device_and_whether_it_contributed(store):
    a, b = enroll(store, 1), enroll(store, 2)
    store.create_study("sa", "{}", "h", None, 1)
    store.create_study("sb", "{}", "h", None, 2)
    store.create_study("sc", "{}", "h", None, 1)
    store.register("sa", a)
    store.register("sb", a)
    store.register("sb", b)
    assert store.add_contribution(contribution("sa", a, payload(1)))
    assert store.memberships(a, ("sa", "sb", "sc", "st-unknown")) == {"sa": True, "sb": False}
    assert store.memberships(b, ("sa", "sb")) == {"sb": False}
    assert store.memberships(a, ("sc",)) == store.memberships(a, ()) == {}
    assert store.memberships("dev-unknown", ("sa", "sb")) == {}
    store.leave("sb", b)
    assert store.memberships(b, ("sb",)) == {}
