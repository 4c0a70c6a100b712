"""Signed webhooks from many steady tenants and one flooder: a noisy-neighbour hour, compressed.

:func:`noisy_neighbour_plan` describes the load; :class:`TrafficGenerator` replays it against a
running ingress (``POST /hooks/{source}``), signing each body as the source's scheme requires
(``X-Hub-Signature-256``: ``sha256=`` + hex HMAC-SHA256 of the raw body). Arrivals per tenant are
a Poisson process; an AI arrival is a *burst* of 2-6 messages in one conversation a fraction of a
second apart, so the debouncer has something to coalesce. A 503 is retried after its Retry-After,
as a provider would. Run on its own it prints its counts as one JSON line every half second::

    DEMO_WEBHOOK_SECRET=s python -m demo.traffic --url http://127.0.0.1:8080
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import hmac
import json
import os
import random
import signal
import sys
from collections import Counter
from collections.abc import Coroutine
from dataclasses import dataclass, field
from typing import Any

from demo.poster import HttpError, Poster

FLOODER = "tenant-flood"
"""The tenant whose storm the demo replays."""
KINDS = ("message", "ai", "engagement")
_ENGAGEMENT_KINDS = ("comment", "like", "mention")
_MAX_ATTEMPTS = 5
_MAX_BACKOFF_S = 2.0
_HTTP_OK = 200
_SHED = 503
_SHORT_PAUSE_S = 0.25
ATTACHMENT_BYTES = 384 * 1024
"""An attachment-sized body: above the 256 KiB a lane may offload at (``demo.offload``)."""


@dataclass(frozen=True, slots=True)
class TenantLoad:
    """One tenant's traffic.

    Attributes:
        name: the tenant id written in each body.
        rate_per_s: arrivals per second (an AI arrival is a burst of several messages).
        weights: relative share of ``message``, ``ai`` and ``engagement`` arrivals.
        start_s: first second of the run with traffic from this tenant.
        end_s: last second (None: until the end).
        conversations: distinct conversations (keys) the tenant's events spread over.
    """

    name: str
    rate_per_s: float
    weights: tuple[float, float, float] = (0.5, 0.25, 0.25)
    start_s: float = 0.0
    end_s: float | None = None
    conversations: int = 20


@dataclass(frozen=True, slots=True)
class Plan:
    """The whole load: how long, and every tenant's traffic."""

    duration_s: float
    tenants: tuple[TenantLoad, ...]
    seed: int = 7


def noisy_neighbour_plan(duration_s: float, *, tenants: int = 50, seed: int = 7) -> Plan:
    """An hour of traffic compressed into ``duration_s``: steady tenants and one storm.

    Five busy tenants arrive at 2/s, the rest at 0.6/s; the flooder sends 120 engagement
    events per second (a viral post) from 25% to 70% of the run.
    """
    loads = [
        TenantLoad(f"tenant-{i:02d}", 2.0 if i < 5 else 0.6)  # noqa: PLR2004 - five busy ones
        for i in range(tenants)
    ]
    loads.append(
        TenantLoad(
            FLOODER,
            120.0,
            weights=(0.05, 0.0, 0.95),
            start_s=duration_s * 0.25,
            end_s=duration_s * 0.70,
            conversations=400,
        )
    )
    return Plan(duration_s, tuple(loads), seed)


def traffic_stage(duration_s: float, elapsed_s: float) -> str:
    """Where ``elapsed_s`` falls in the plan of a ``duration_s`` run: calm, flood or after flood."""
    (flooder,) = [t for t in noisy_neighbour_plan(duration_s).tenants if t.name == FLOODER]
    if elapsed_s < flooder.start_s:
        return "calm"
    if flooder.end_s is None or elapsed_s < flooder.end_s:
        return "flood"
    return "after flood"


async def _pause(stop: asyncio.Event, delay_s: float) -> bool:
    """Wait ``delay_s``; True if ``stop`` was set meanwhile."""
    if delay_s <= _SHORT_PAUSE_S:  # a plain sleep is much cheaper than a wait_for task
        if delay_s > 0:
            await asyncio.sleep(delay_s)
        return stop.is_set()
    try:
        await asyncio.wait_for(stop.wait(), delay_s)
    except TimeoutError:
        return False
    return True


def sign_hub(secret: str, body: bytes) -> str:
    """The ``X-Hub-Signature-256`` value for ``body`` (Meta and GitHub)."""
    return "sha256=" + hmac.new(secret.encode(), body, hashlib.sha256).hexdigest()


@dataclass
class Counts:
    """What the generator sent and how the ingress answered."""

    sent: int = 0
    accepted: int = 0
    duplicate: int = 0
    shed: int = 0
    rejected: int = 0
    failed: int = 0
    large: int = 0
    """Accepted bodies carrying an attachment (:data:`ATTACHMENT_BYTES`)."""
    by_kind: Counter[str] = field(default_factory=Counter)

    def as_dict(self) -> dict[str, object]:
        """A JSON-ready copy."""
        return {
            "sent": self.sent,
            "accepted": self.accepted,
            "duplicate": self.duplicate,
            "shed": self.shed,
            "rejected": self.rejected,
            "failed": self.failed,
            "large": self.large,
            "by_kind": dict(self.by_kind),
        }


class TrafficGenerator:
    """Replays a :class:`Plan` against ``{url}/hooks/{source}``."""

    def __init__(self, plan: Plan, client: Poster, source: str, secret: str, run_id: str) -> None:
        """Post with ``client`` (based at the ingress) to ``source``, signed with ``secret``."""
        self.plan = plan
        self.counts = Counts()
        self._client = client
        self._path = f"/hooks/{source}"
        self._secret = secret
        self._run_id = run_id
        self._tasks: set[asyncio.Task[None]] = set()
        self._sequence = 0

    async def run(self, stop: asyncio.Event) -> Counts:
        """Send the plan's traffic until its end or ``stop``; wait for answers; return counts."""
        tenants = [
            asyncio.create_task(
                self._tenant(load, random.Random(f"{self.plan.seed}:{load.name}"), stop)
            )
            for load in self.plan.tenants
        ]
        await asyncio.gather(*tenants)
        while self._tasks:
            await asyncio.gather(*list(self._tasks))
        return self.counts

    async def _tenant(self, load: TenantLoad, rng: random.Random, stop: asyncio.Event) -> None:
        loop = asyncio.get_running_loop()
        begin = loop.time()
        end_s = min(
            load.end_s if load.end_s is not None else self.plan.duration_s, self.plan.duration_s
        )
        at_s = load.start_s + rng.expovariate(load.rate_per_s)
        while at_s < end_s and not stop.is_set():
            if await _pause(stop, begin + at_s - loop.time()):
                return
            kind = rng.choices(KINDS, weights=load.weights)[0]
            conversation = f"{load.name}-c{rng.randrange(load.conversations)}"
            if kind == "ai":
                self._spawn(self._burst(load.name, conversation, rng, stop))
            else:
                self._spawn(self._post(self._body(load.name, conversation, kind, rng)))
            at_s += rng.expovariate(load.rate_per_s)

    def _spawn(self, coro: Coroutine[Any, Any, None]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _burst(
        self, tenant: str, conversation: str, rng: random.Random, stop: asyncio.Event
    ) -> None:
        """Several messages in one conversation, a typing pause apart (one debounced turn)."""
        for i in range(rng.randint(2, 6)):
            if i and await _pause(stop, rng.uniform(0.2, 1.2)):
                return
            await self._post(self._body(tenant, conversation, "ai", rng))

    def _body(self, tenant: str, conversation: str, kind: str, rng: random.Random) -> bytes:
        self._sequence += 1
        text = f"message {self._sequence} from {tenant}"
        roll = rng.random()
        if kind == "engagement":
            kind = rng.choice(_ENGAGEMENT_KINDS)
            if roll < 0.005:  # noqa: PLR2004 - a little spam for the dead-letter topic
                text = "buy followers: spam"
        elif kind == "message" and roll < 0.003:  # noqa: PLR2004 - a provider limit: retried
            text = "rate limited by the provider"
        elif kind == "message" and roll < 0.005:  # noqa: PLR2004 - an empty message: dead letter
            text = ""
        event = {
            "id": f"{self._run_id}-{self._sequence}",
            "tenant": tenant,
            "conversation_id": conversation,
            "kind": kind,
            "text": text,
        }
        if kind == "message" and 0.005 <= roll < 0.025:  # noqa: PLR2004 - an attachment
            event["attachment"] = "a" * ATTACHMENT_BYTES
        return json.dumps(event, separators=(",", ":")).encode()

    async def _post(self, body: bytes) -> None:
        """POST one signed webhook, retrying a 503 or a connection error like a provider."""
        counts = self.counts
        counts.sent += 1
        headers = {
            "content-type": "application/json",
            "x-hub-signature-256": sign_hub(self._secret, body),
        }
        for attempt in range(1, _MAX_ATTEMPTS + 1):
            try:
                response = await self._client.post(self._path, body, headers)
            except HttpError:
                retry_after_s = 0.2 * attempt
            else:
                if response.status == _HTTP_OK:
                    status = json.loads(response.body).get("status")
                    if status == "duplicate":
                        counts.duplicate += 1
                    else:
                        counts.accepted += 1
                        counts.by_kind[json.loads(body)["kind"]] += 1
                        counts.large += len(body) > ATTACHMENT_BYTES
                    return
                if response.status != _SHED:
                    counts.rejected += 1
                    return
                counts.shed += 1
                retry_after_s = float(response.headers.get("retry-after", "1"))
            await asyncio.sleep(min(retry_after_s, _MAX_BACKOFF_S))  # a provider's back-off
        counts.failed += 1


async def _main(args: argparse.Namespace) -> None:
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGTERM, signal.SIGINT):
        loop.add_signal_handler(sig, stop.set)
    secret = os.environ.get(args.secret_env, "")
    if not secret:
        sys.exit(f"error: environment variable {args.secret_env} is not set")
    plan = noisy_neighbour_plan(args.duration_s, tenants=args.tenants, seed=args.seed)
    client = Poster(args.url, args.connections)
    try:
        generator = TrafficGenerator(plan, client, args.source, secret, args.run_id)

        async def report() -> None:
            while True:
                print(json.dumps(generator.counts.as_dict()), flush=True)  # noqa: T201
                await asyncio.sleep(0.5)

        reporter = asyncio.create_task(report())
        counts = await generator.run(stop)
        reporter.cancel()
    finally:
        await client.close()
    print(json.dumps({**counts.as_dict(), "done": True}), flush=True)  # noqa: T201


def main(argv: list[str] | None = None) -> None:
    """Command line: replay the noisy-neighbour plan against a running ingress."""
    parser = argparse.ArgumentParser(
        prog="python -m demo.traffic",
        description=(
            "Replay the demo's noisy-neighbour plan (steady tenants and one flooder) against a"
            " running ingress, signing each body with the secret in --secret-env. Prints its"
            " counts as one JSON line every half second."
        ),
    )
    parser.add_argument("--url", required=True, help="the ingress, e.g. http://127.0.0.1:8080")
    parser.add_argument("--source", default="demo", help="the source name in the sources file")
    parser.add_argument(
        "--secret-env", default="DEMO_WEBHOOK_SECRET", help="variable with the secret"
    )
    parser.add_argument("--duration-s", type=float, default=180.0, help="length of the run")
    parser.add_argument(
        "--tenants", type=int, default=50, help="steady tenants besides the flooder"
    )
    parser.add_argument("--connections", type=int, default=32, help="HTTP connections at most")
    parser.add_argument("--run-id", default="demo", help="prefix of every event id")
    parser.add_argument("--seed", type=int, default=7, help="random seed of the plan")
    asyncio.run(_main(parser.parse_args(argv)))


if __name__ == "__main__":
    main()
