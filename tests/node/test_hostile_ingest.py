"""Hostile rollouts against a training node (attacks 3, 8 and 9 of the threat list).

The victim is a real ``Node`` (tiny model, arith) on a real ``SwarmTransport``. An honest peer (a
transport publishing correct, well-formed rollouts) and a raw hivemind attacker (``tests.swarm.attacker``:
its own manifests, its own batch handler) publish to it; then the victim runs a training step. Each
test checks the victim's counters, that the honest groups were trained on, and that no completion whose
text is not the right answer was trained with a positive advantage.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Iterator
from typing import Any

import pytest
import torch

from node.run.node import Node
from node.train.groups import TrainGroup
from protocol.identity import Identity
from protocol.records import Rollout, RolloutBatch, RolloutGroup, SamplingParams
from protocol.taskref import TaskRef
from swarm.settings import SwarmSettings
from swarm.transport import SwarmTransport
from tests.node.conftest import make_config
from tests.swarm.attacker import Attacker, peer_id_of, wait_until
from tests.swarm.conftest import SWARM_ID, fast_settings, p2pd_pid

HONEST_SEED = 11


class Victim:
    """The node under attack, with what each training step trained on."""

    def __init__(self, node: Node) -> None:
        self.node = node
        self.trained: list[list[tuple[TrainGroup, torch.Tensor]]] = []
        real_step = node.trainer.step

        def spy(groups: list[TrainGroup], **options: Any) -> dict[str, float]:
            self.trained.append([(g, g.advantages.clone()) for g in groups if g.advantages is not None])
            return real_step(groups, **options)

        node.trainer.step = spy  # type: ignore[method-assign]

    @property
    def transport(self) -> SwarmTransport:
        transport = self.node.exchange.transport  # type: ignore[union-attr]
        assert isinstance(transport, SwarmTransport)
        return transport

    def text(self, ids: list[int]) -> str:
        """A completion as the node would have generated it: final EOS dropped, nothing skipped."""
        tok = self.node.policy.tokenizer
        body = ids[:-1] if ids and ids[-1] == tok.eos_token_id else ids
        return str(tok.decode(body, skip_special_tokens=False))

    def positive_peer_completions(self, step: int = -1) -> list[tuple[str, str, str]]:
        """``(peer id, completion text, right answer)`` of every peer completion trained with A > 0."""
        out = []
        for group, advantages in self.trained[step]:
            if group.is_local:
                continue
            source = self.node.source
            name, dataset, config_hash, seed, index = group.key.split("/")
            answer = source.task(TaskRef(name, dataset, config_hash, int(seed), int(index))).answer
            for ids, adv in zip(group.completions, advantages.tolist()):
                if adv > 0:
                    out.append((group.peer_id, self.text(ids), str(answer)))
        return out


@dataclasses.dataclass
class Net:
    victim: Victim
    honest: SwarmTransport
    attacker: Attacker

    # -- rollouts as a peer with the victim's tokenizer would write them ------------------------------

    def ref(self, index: int, *, seed: int = HONEST_SEED, dataset: str = "add") -> TaskRef:
        """The ``index``-th training task of ``seed``'s numbering (held-out tasks are rejected on arrival)."""
        source = self.victim.node.source
        refs = (source.make_ref(dataset, i, seed=seed) for i in itertools.count())
        training = (ref for ref in refs if not source.is_held_out(source.task(ref)))
        return next(itertools.islice(training, index, None))

    def answer(self, ref: TaskRef) -> str:
        return str(self.victim.node.source.task(ref).answer)

    def rollout(self, ref: TaskRef, text: str, *, ids: list[int] | None = None, lps: list[float] | None = None,
                finish: str = "eos") -> Rollout:
        policy = self.victim.node.policy
        tok = policy.tokenizer
        if ids is None:
            ids = list(tok(text, add_special_tokens=False)["input_ids"])
            if finish == "eos":
                ids.append(tok.eos_token_id)
        return Rollout(task=ref, prompt="", completion=text, completion_ids=tuple(ids),
                       tokenizer_fingerprint=policy.tokenizer_fingerprint,
                       behavior_logprobs=tuple(lps if lps is not None else [-0.7] * len(ids)),
                       sampling=SamplingParams(1.0, 1.0), model_fingerprint="peer", policy_step=0,
                       finish_reason=finish)

    def honest_batch(self, first_index: int, n_groups: int = 2) -> RolloutBatch:
        """Groups of two right and two wrong answers: every one has signal."""
        groups = []
        for index in range(first_index, first_index + n_groups):
            ref = self.ref(index)
            right = self.answer(ref)
            wrong = f"{(int(right) + 1) % 10 ** len(right):0{len(right)}d}"
            texts = [right, right, wrong, wrong]
            groups.append(RolloutGroup(ref, tuple(self.rollout(ref, t) for t in texts)))
        return RolloutBatch(SWARM_ID, self.honest.identity.public_key, (), 0, 0, 0.0, tuple(groups))

    # -- delivery -----------------------------------------------------------------------------------------

    def deliver(self, honest: RolloutBatch | None, attacks: list[tuple[Identity, RolloutBatch]]) -> None:
        """Publish the honest batch and the attacker's, and wait until the victim's transport holds them."""
        transport = self.victim.transport
        expected = transport.stats()["batches_accepted"] + len(attacks) + (honest is not None)
        epoch = transport.current_epoch()
        records = [self.attacker.manifest_record(author, dataclasses.replace(batch, author=author.public_key,
                                                                             seq=k), epoch=epoch)
                   for k, (author, batch) in enumerate(attacks)]
        if records:
            assert self.attacker.store_many(peer_id_of(transport), records) == [True] * len(records)
        if honest is not None:
            assert self.honest.publish(honest) is not None
        assert wait_until(lambda: transport.stats()["batches_accepted"] >= expected, timeout=20)

    def step(self) -> dict[str, Any]:
        record = self.victim.node.train_step()
        assert all(torch.isfinite(p).all() for p in self.victim.node.policy.trainable_state().values())
        return record

    def honest_trained(self, step: int = -1) -> int:
        return sum(1 for g, _ in self.victim.trained[step] if g.peer_id == self.honest.identity.peer_id)


@pytest.fixture(scope="module")
def net(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Net]:
    run_dir = tmp_path_factory.mktemp("victim")
    cfg = make_config(str(run_dir), "sapo.local_groups=2", "sapo.external_groups=8", "generation.group_size=4",
                      "train.loss=grpo", "train.steps=100", "train.eval_every=1000", "train.checkpoint_every=1000",
                      f"swarm.swarm_id={SWARM_ID}", "swarm.epoch_seconds=600", "swarm.collect_interval=0.2",
                      "swarm.request_timeout=3", "swarm.startup_timeout=20")
    started: list[SwarmTransport] = []

    def factory(settings: SwarmSettings, identity: Identity) -> SwarmTransport:
        transport = SwarmTransport(settings, identity)
        started.append(transport)
        transport.start(wait=True)
        p2pd_pid(transport)
        return transport

    node = Node(cfg, show_progress=False, transport=factory)
    honest: SwarmTransport | None = None
    attacker: Attacker | None = None
    try:
        node.setup()
        victim = Victim(node)
        maddrs = victim.transport.visible_multiaddrs()
        honest = SwarmTransport(fast_settings(initial_peers=maddrs, epoch_seconds=600), Identity.generate())
        honest.start(wait=True)
        p2pd_pid(honest)
        attacker = Attacker(SWARM_ID, maddrs)
        yield Net(victim, honest, attacker)
    finally:
        for closer in (attacker, honest):
            if closer is not None:
                closer.close()
        node.close()
        for transport in started:
            transport.close()


def test_special_tokens_around_a_right_answer_earn_nothing(net: Net) -> None:
    """Attack 3: ``[EOS] 042 [EOS]`` decodes to ``042`` when special tokens are skipped; as generated it is
    an empty answer. Also ``042\\n<anything>``, once scored by its first line only."""
    mallory = Identity.generate()
    eos = net.victim.node.policy.tokenizer.eos_token_id
    groups = []
    for index in (100, 101):
        ref = net.ref(index, seed=HONEST_SEED + 1)
        right = net.answer(ref)
        right_ids = list(net.victim.node.policy.tokenizer(right, add_special_tokens=False)["input_ids"])
        hidden = net.rollout(ref, right, ids=[eos, *right_ids, eos])
        trailing = net.rollout(ref, f"{right}\n99")
        wrong = net.rollout(ref, "000" if right != "000" else "001")
        groups.append(RolloutGroup(ref, (hidden, hidden, trailing, wrong)))
    attack = RolloutBatch(SWARM_ID, mallory.public_key, (), 0, 0, 0.0, tuple(groups))
    before = dict(net.victim.node.exchange.ingestor.rejected)  # type: ignore[union-attr]
    net.deliver(net.honest_batch(0), [(mallory, attack)])
    net.step()
    rejected = net.victim.node.exchange.ingestor.rejected  # type: ignore[union-attr]
    assert rejected["special_token"] - before.get("special_token", 0) == 4
    assert net.honest_trained() == 2
    for peer, text, answer in net.victim.positive_peer_completions():
        assert text == answer, (peer[:8], text, answer)


def test_many_seeds_and_foreign_datasets_cost_no_tables(net: Net) -> None:
    """Attack 8: refs naming 40 distinct seeds (each a new 10,000-problem table) and another dataset."""
    mallory = Identity.generate()
    foreign = [RolloutGroup(r, (net.rollout(r, "000"), net.rollout(r, "001")))
               for r in (net.ref(i, dataset="mul") for i in range(4))]
    seeded = [RolloutGroup(r, (net.rollout(r, "000"), net.rollout(r, "001")))
              for r in (net.ref(1, seed=1000 + s) for s in range(40))]
    attack = RolloutBatch(SWARM_ID, mallory.public_key, (), 0, 0, 0.0, (*foreign, *seeded))
    orders = net.victim.node.source._orders  # type: ignore[attr-defined]
    net.victim.node.source.task(net.ref(0))  # the honest seed's table, built once whichever test runs first
    misses = orders.misses
    before = dict(net.victim.node.exchange.ingestor.rejected)  # type: ignore[union-attr]
    net.deliver(net.honest_batch(10), [(mallory, attack)])
    record = net.step()
    rejected = net.victim.node.exchange.ingestor.rejected  # type: ignore[union-attr]
    assert rejected["foreign_dataset"] - before.get("foreign_dataset", 0) == 4
    assert rejected["seed_cap"] - before.get("seed_cap", 0) >= 10  # 16 groups looked at, 2 seeds built
    assert orders.misses - misses <= 2  # at most two new tables for mallory; the honest seed is cached
    assert record["ingest_seconds"] < 5.0  # generous (loaded machine); 40 tables took 40 x 60 ms alone
    assert net.honest_trained() == 2
    for peer, text, answer in net.victim.positive_peer_completions():
        assert text == answer, (peer[:8], text, answer)


def test_absurd_behaviour_logprobs_are_rejected_and_punished(net: Net) -> None:
    """Attack 9: log-probs of -3e38 (finite float32) made one GRPO step turn every parameter non-finite."""
    mallory = Identity.generate()
    ref = net.ref(200, seed=HONEST_SEED + 2)
    right = net.answer(ref)
    poisoned = net.rollout(ref, right, lps=[-3e38] * (len(right) + 1))
    attack = RolloutBatch(SWARM_ID, mallory.public_key, (), 0, 0, 0.0,
                          (RolloutGroup(ref, (poisoned, net.rollout(ref, "000"))),))
    net.deliver(net.honest_batch(20), [(mallory, attack)])
    net.step()  # asserts every trainable parameter is still finite
    ingestor = net.victim.node.exchange.ingestor  # type: ignore[union-attr]
    assert ingestor.rejected["bad_logprobs"] >= 1 and ingestor.offences["bad_logprobs"] >= 1
    assert net.honest_trained() == 2
    # Reported to the peer book: the author is banned, its next batch is not even pulled.
    offences = net.victim.transport.stats()["offences"]
    assert isinstance(offences, dict) and offences.get("bad_logprobs", 0) >= 1
    banned = net.victim.transport.stats()["batches_rejected"]
    assert isinstance(banned, dict)
    before = banned.get("banned", 0)
    key, value, expiration, subkey = net.attacker.manifest_record(
        mallory, dataclasses.replace(attack, seq=7), epoch=net.victim.transport.current_epoch())
    assert net.attacker.store(peer_id_of(net.victim.transport), key, value, expiration, subkey=subkey)
    assert wait_until(lambda: net.victim.transport.stats()["batches_rejected"].get("banned", 0) == before + 1)
    for peer, text, answer in net.victim.positive_peer_completions():
        assert text == answer, (peer[:8], text, answer)
