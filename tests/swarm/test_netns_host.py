"""A public swarm that outlives its only host, in network namespaces this test creates (``scripts/lib/netlab/netns.py``).

One ``swarm-node host`` and four tiny-base members started with docs/swarm.md's join command
(``configs/public-swarm.yaml``: ``client_mode: auto``), two on public addresses and two behind the lab's NAT.
The public ones find out that peers can dial them and become full members; the NATed ones stay clients
and hand their batches to the host and to those members. Every count the host's page shows equals the
one computed from the members' own records. Then the host is killed: the members go on accepting each
other's batches (at least 90% of those published after the kill, within two epochs), and a NATed member
restarted with the same command (the host's URL is dead: the descriptor saved in its run dir) joins within
one epoch through the members it remembers, and exchanges again. Skipped like ``test_netns.py`` where
namespaces cannot be made, failed instead where ``SWARM_NODE_NETNS=require``.
"""

from __future__ import annotations

import json
import signal
import time
from typing import Any

import pytest

from scripts.lib.netlab import checks
from scripts.lib.netlab import swarm as lab_swarm
from tests.swarm.test_netns import _REASON, _REQUIRED, SMALL_STEPS, lab, wait_until  # noqa: F401 (a fixture)

pytestmark = pytest.mark.skipif(_REASON is not None and not _REQUIRED, reason=str(_REASON))

EPOCH = 10.0


def _exchanged(members: list[Any], ids: dict[Any, str], after: float = 0.0) -> bool:
    return all(m.accepted_from(ids[o], after) > 0 for m in members for o in members if o is not m)


def _why(members: list[Any], ids: dict[Any, str], after: float = 0.0) -> str:
    return json.dumps({ids[m][:8]: {"steps": m.steps(), "exit": m.proc.poll(), "tail": m.log.read_text()[-600:],
                                    "from": {ids[o][:8]: m.accepted_from(ids[o], after) for o in members if o is not m}}
                       for m in members})


# 3 to 4 minutes at a load average of 8 to 12 on 2 cores (135 s idle): five processes, four of them tiny-base
# members. Slow: the default suite holds the same on loopback in one process
# (tests/swarm/test_host.py::test_a_member_joins_again_through_a_peer_it_met_when_its_host_is_gone and
# ::test_a_host_that_died_mid_epoch_counts_what_its_members_published).
@pytest.mark.slow
@pytest.mark.timeout(1200)
def test_members_keep_exchanging_when_their_only_host_is_gone(lab: Any, tmp_path: Any) -> None:  # noqa: F811
    h = lab.add_host()
    places = [lab.add_host(), lab.add_host(), lab.add_host(nat=True), lab.add_host(nat=True)]
    descriptor, keys = lab_swarm.init_swarm(tmp_path, [h.ip], overrides=[f"swarm.epoch_seconds={EPOCH}"])
    host_p2p = lab_swarm.host_peer_id(descriptor)
    host = lab_swarm.start_host(h.popen, str(descriptor), tmp_path / "host0", keys[0])
    lab_swarm.wait_for_text(tmp_path / "host0.log", "members join with", 120, host)
    url = f"http://{h.ip}:{lab_swarm.API_PORT}/swarm.yaml"
    members = [lab_swarm.start_member(p.popen, url, tmp_path / f"m{i}", p.ip, nat=None, extra=SMALL_STEPS)
               for i, p in enumerate(places)]
    ids = {m: m.peer_id() for m in members}
    assert wait_until(lambda: _exchanged(members, ids), 300), _why(members, ids)

    # Reachability found out, not configured: the public members are full members, the NATed ones clients.
    full = [m for m in members if any(e.get("ev") == "reachable" for e in m.trace())]
    assert full == members[:2], [m.run_dir.name for m in full]
    for m in members[:2]:
        assert "it is a full member now" in m.log.read_text()

    # Every count on the host's page equals the one computed from the members' own records (closed epochs,
    # each member's whole epoch inside the window: after its first batch).
    first = max(min(float(e["created"]) for e in m.trace() if e.get("ev") == "pub") for m in members)
    time.sleep(max(0.0, (first // EPOCH + 4) * EPOCH - time.time()))  # two whole epochs after it, and one more
    doc = checks.fetch_json(places[0], f"http://{h.ip}:{lab_swarm.API_PORT}/api/swarm?epochs=8")
    current = int(doc["host"]["epoch"])
    epochs = [e for e in range(current - 7, current - 1) if e * EPOCH > first]
    assert epochs, (first, current)
    wrong = checks.host_count_mismatches(doc, members, ids, host_p2p=host_p2p, epochs=epochs, epoch_seconds=EPOCH)
    assert not wrong, wrong
    assert doc["host"]["network"]["connected"] and doc["host"]["network"]["connections"] >= 4
    assert sum(m["handed_off"] for m in doc["members"]) > 0  # the NATed members handed batches to the host

    host.kill()  # the only host is gone, for good
    host.wait(timeout=30)
    killed = time.time()
    steps = {m: m.steps() for m in members}
    time.sleep(4 * EPOCH)
    assert all(m.steps() > steps[m] for m in members)  # they kept training
    # Restart a NATed member with the same command: the URL is dead, so it joins with its saved descriptor,
    # through the peers it remembers (the full members and the host; never the other NATed member).
    restarted = members[2]
    remembered = " ".join(lab_swarm.remembered(restarted.run_dir))
    assert all(ids_p2p in remembered for ids_p2p in _p2p_ids(members[:2])) and _p2p_ids([members[3]])[0] not in remembered
    restarted.proc.send_signal(signal.SIGTERM)
    assert restarted.proc.wait(timeout=120) == 0
    measured_until = time.time()
    again = time.time()
    members[2] = lab_swarm.start_member(places[2].popen, url, restarted.run_dir, places[2].ip, nat=None,
                                        extra=SMALL_STEPS)
    ids[members[2]] = ids.pop(restarted)
    assert wait_until(lambda: checks.join_seconds(members[2], after=again) is not None, 300), _why(members, ids)
    joined = checks.join_seconds(members[2], after=again)
    assert joined is not None and joined <= EPOCH, joined
    said = members[2].log.read_text()
    assert "does not answer; joining with the copy of the descriptor saved in" in said, said[-2000:]
    assert wait_until(lambda: _exchanged(members, ids, after=again + 5), 240), _why(members, ids, again)

    # Of the batches published after the kill (and old enough), the others accepted at least 90% within two
    # epochs. The restarted member's are left out: it was gone part of that time.
    steady = members[:2] + members[3:]
    result = checks.delivery(steady, ids, after=killed, until=measured_until - 2 * EPOCH, window=2 * EPOCH)
    assert result.pairs > 20 and result.share >= 0.9, result
    print(f"host killed: {result.within}/{result.pairs} (batch, receiver) pairs accepted within two epochs "
          f"({100 * result.share:.1f}%), {result.late} later; the restarted member joined {joined:.2f} s after its "
          f"network side started; host counts checked over epochs {epochs}")

    for m in members:
        m.proc.send_signal(signal.SIGTERM)
    assert [m.proc.wait(timeout=120) for m in members] == [0] * 4
    for m in members:  # nobody honest was banned
        offences = [e for e in m.trace() if e.get("ev") == "rej" and e.get("offence")]
        assert not offences, offences


def _p2p_ids(members: list[Any]) -> list[str]:
    """The libp2p peer ids the members printed at start (what addresses and known_peers.txt name them by)."""
    found = []
    for m in members:
        text = m.log.read_text()
        marker = "(libp2p peer id "
        found.append(text[text.index(marker) + len(marker):].split(")")[0] if marker in text else "?")
    return found
