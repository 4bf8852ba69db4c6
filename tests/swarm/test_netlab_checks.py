"""``scripts.lib.netlab.checks.host_count_mismatches``, the comparison of a host's page with its members' own
records that the network-namespace tests rely on, checked on hand-made traces (pure)."""

from __future__ import annotations

from typing import Any

from scripts.lib.netlab.checks import host_count_mismatches

HOST = "12D3KooWJWoaqZhDaoEFshF7Rh1bpY9ohihFhzcW6d69Lr2NASuq"
EPOCH = 60.0


class Member:
    def __init__(self, events: list[dict[str, Any]]) -> None:
        self.events = events

    def trace(self) -> list[dict[str, Any]]:
        return self.events


def _page(announced: int, pulled: int, handed: int, epoch: int = 10) -> dict[str, Any]:
    return {"members": [{"peer_id": "alice", "epochs": [
        {"epoch": epoch, "announced": announced, "pulled": pulled, "handed_off": handed}]}]}


def _check(doc: dict[str, Any], events: list[dict[str, Any]], epochs: list[int]) -> list[str]:
    member = Member(events)
    return host_count_mismatches(doc, [member], {member: "alice"}, host_p2p=HOST, epochs=epochs, epoch_seconds=EPOCH)


def test_a_host_page_is_compared_with_what_its_members_recorded() -> None:
    """Mutations caught: a hand-off event with no ``to`` taken for one to the host (``startswith("")``), and an
    epoch without batches taken as a match (a page of zeros "agrees" with it)."""
    pubs = [{"ev": "pub", "id": f"b{i}", "created": 600.0 + i, "ok": True} for i in range(3)]
    to_host = [{"ev": "handoff", "id": "b0", "to": HOST[:16]}]
    assert _check(_page(3, 2, 1), pubs + to_host, [10]) == []
    # A hand-off that names no peer is no hand-off to this host: the page that counts it pulled is right.
    nameless = [{"ev": "handoff", "id": "b0", "to": ""}, {"ev": "handoff", "id": "b1"}]
    assert _check(_page(3, 3, 0), pubs + nameless, [10]) == []
    assert _check(_page(3, 2, 1), pubs + nameless, [10]) != []
    assert _check(_page(3, 3, 0), pubs + [{"ev": "handoff", "id": "b0", "to": "12D3KooWOther000"}], [10]) == []
    # Nothing published in the epoch compared: reported, however well the zeros agree.
    assert _check(_page(0, 0, 0, epoch=11), pubs, [11]) == [
        "epoch 11: no member published a batch (nothing to compare)"]
    assert _check(_page(3, 2, 0), pubs, [10]) != []  # a count that differs
