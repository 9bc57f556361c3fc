"""The deliverer: each active subscription's feed events, in feed order, POSTed
to its URL signed by the Standard Webhooks rules (docs/webhooks.md).

- One deliverer per database leads (an advisory lock of its own, as the
  projection loop and the ledger sequencer have: PostgreSQL's session lock,
  SQLite's flock), so one process delivers a subscription however many nodes
  run; a killed leader's lock is free at once and another takes over.
- In the leader, a thread per active subscription: a slow or failing
  endpoint holds back only its own. It reads its feed from the stored
  cursor and sends the first event of its types; the next only after a 2xx
  (the cursor moves, in the database, in the attempt's own transaction) or
  after it gave up (the subscription disabled with the reason, its cursor
  on that event). A SIGKILL between the answer and the write sends that
  event again: the same ``webhook-id``, never a later one first.
- A failure waits ``retry_schedule[n-1]`` seconds (+-20 % jitter) before
  attempt n+1, longer if ``Retry-After`` asks (up to an hour, or the
  schedule's longest wait); 410 Gone disables at once; past the schedule's end, disabled.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import logging
import random
import threading
import time
import uuid
from dataclasses import dataclass
from typing import Any

from kandev_es import loops, metrics
from kandev_es.observability import serving, tracing
from kandev_es.projections.leadership import Leadership, make_leadership
from kandev_es.services.feeds import FeedItem
from kandev_es.webhooks.addresses import NetworkPolicy
from kandev_es.webhooks.feed import FeedReader
from kandev_es.webhooks.progress import FLUSH_SECONDS, MAX_UNWRITTEN, Progress
from kandev_es.webhooks.signing import KeyFile, signature_header
from kandev_es.webhooks.store import ACTIVE, DISABLED, Attempt, Subscription, SubscriptionStore
from kandev_es.webhooks.transport import Outcome, new_client, post

log = logging.getLogger("kandev_es.webhooks")
# The deliverer's advisory lock class ("kes5"), apart from the other leaders'.
LOCK_CLASS = int.from_bytes(b"kes5", "big")
SCAN_SECONDS = 1.0  # how soon a new or resumed subscription gets its thread
PAGE = 100
REREAD_SECONDS = 1.0
# A Retry-After is honoured up to an hour (or the schedule's longest wait).
RETRY_AFTER_CAP = 3600.0
DELIVERED, FAILED, NO_ANSWER, GONE = "delivered", "failed", "no_answer", "gone"
RESULTS = (DELIVERED, FAILED, NO_ANSWER, GONE)


@dataclass(frozen=True)
class Rules:
    policy: NetworkPolicy
    schedule: tuple[float, ...]
    timeout: float


def _describe(outcome: Outcome) -> str:
    if outcome.status is None:
        return f"no answer ({outcome.snippet})"
    return f"HTTP {outcome.status}"


def decide(
    s: Subscription, item: FeedItem, outcome: Outcome, rules: Rules, now: float
) -> tuple[str, dict[str, Any], float | None]:
    """The attempt's result, the subscription's changes, its next attempt."""
    if outcome.delivered:
        return DELIVERED, {"cursor": item.position, "attempts": 0, "next_attempt_at": 0.0}, None
    attempts = s.attempts + 1
    if outcome.status == 410:
        reason = f"410 Gone at feed position {item.position}: the receiver asked to stop"
        return GONE, {"state": DISABLED, "reason": reason, "attempts": attempts}, None
    result = FAILED if outcome.status is not None else NO_ANSWER
    if attempts > len(rules.schedule):
        reason = (
            f"gave up at feed position {item.position} after {attempts} attempts"
            f" over the retry schedule; last: {_describe(outcome)}"
        )
        return result, {"state": DISABLED, "reason": reason, "attempts": attempts}, None
    wait = rules.schedule[attempts - 1] * random.uniform(0.8, 1.2)
    if outcome.retry_after is not None:
        wait = max(wait, min(outcome.retry_after, max(RETRY_AFTER_CAP, *rules.schedule)))
    return result, {"attempts": attempts, "next_attempt_at": now + wait}, now + wait


class Deliverer:
    def __init__(
        self,
        store: SubscriptionStore,
        feed: FeedReader,
        key: KeyFile,
        rules: Rules,
        lead: Leadership | None = None,
    ) -> None:
        self.store = store
        self.feed = feed
        self.key = key
        self.rules = rules
        self._lead = lead or make_leadership(store.database, "webhook", LOCK_CLASS)
        self._stop = threading.Event()
        self._loops: list[threading.Thread] = []
        self._leading = threading.Event()
        self._threads: dict[uuid.UUID, threading.Thread] = {}
        self._progress: dict[uuid.UUID, Progress] = {}

    # ----- leadership and the threads -------------------------------------
    def run_forever(self) -> None:
        flusher = threading.Thread(target=self._flush_all, name="webhook-flusher", daemon=True)
        flusher.start()
        try:
            while not self._stop.is_set():
                if self._lead.hold():
                    if not self._leading.is_set():
                        log.info("webhooks: this process delivers now")
                    self._leading.set()
                    self._start_threads()
                else:
                    self._leading.clear()
                self._stop.wait(SCAN_SECONDS)
        finally:
            self._leading.clear()
            for thread in list(self._threads.values()):
                thread.join(self.rules.timeout + 2)
            flusher.join(1.0)
            self._lead.release()

    def _start_threads(self) -> None:
        try:
            active = self.store.all(ACTIVE)
            now = time.time()
            if any(s.old_secret and (s.old_secret_until or 0) < now for s in active):
                self.store.drop_expired_secrets(now)
        except Exception as error:  # the store away: the next scan tries again
            # (an escaped error here would end run_forever: no more deliveries)
            log.warning("webhooks: cannot list subscriptions (%s)", error)
            return
        for s in active:
            thread = self._threads.get(s.id)
            if thread is None or not thread.is_alive():
                thread = threading.Thread(
                    target=self._run_subscription,
                    args=(s.id,),
                    name=f"webhook-{s.id}",
                    daemon=True,
                )
                self._threads[s.id] = thread
                thread.start()

    def start_thread(self) -> threading.Thread:
        self._stop.clear()
        return loops.start(self.run_forever, "webhooks", self._loops)

    def stop(self) -> None:
        """Stop the loop and wait for it: the store may be closed after."""
        loops.stop(self._stop, self._loops)

    # ----- one subscription -------------------------------------------------
    def _run_subscription(self, subscription_id: uuid.UUID) -> None:
        here = Progress(subscription_id)
        self._progress[subscription_id] = here
        try:
            with new_client(self.rules.policy, self.rules.timeout) as client:
                while not self._stop.is_set() and self._leading.is_set():
                    try:
                        if not self.step(here, client):
                            return
                    except Exception as error:  # the store away: try again in a moment
                        log.warning("webhooks: subscription %s: %s", subscription_id, error)
                        here.read_at = 0.0  # read it again (what is unwritten stays)
                        self._stop.wait(1.0)
        finally:
            self._progress.pop(subscription_id, None)
            with contextlib.suppress(Exception):  # the store away: those are sent again
                here.flush(self.store)

    def _flush_all(self) -> None:
        """The flusher: every FLUSH_SECONDS, each subscription's progress."""
        while not self._stop.wait(FLUSH_SECONDS):
            for here in list(self._progress.values()):
                if here.due():
                    try:
                        here.flush(self.store)
                    except Exception as error:  # the store away: kept for the next try
                        log.warning("webhooks: progress of %s not written: %s", here.id, error)

    def _fresh(self, here: Progress) -> Subscription | None:
        """The subscription as this thread has it; read again from the store
        at most every REREAD_SECONDS, and after a write of ours was refused
        (an operator changed it): a pause, a replay or a deletion reaches
        this thread within that, or at its next write."""
        now = time.monotonic()
        if here.stale(now, REREAD_SECONDS):
            here.flush(self.store)  # what was done, before anything is read again
            fresh = self.store.get(here.id)
            if fresh is None or fresh.state != ACTIVE:
                return None
            if here.written is None or here.refused or fresh.generation != here.written.generation:
                here.adopt(fresh, now)
            here.read_at = now
        return here.s

    def step(self, here: Progress, client: Any) -> bool:
        """One move of a subscription: wait for its next attempt, skip events
        of other types, or deliver its next event once. False: it is no
        longer active (or gone)."""
        s = self._fresh(here)
        if s is None:
            return False
        wait = s.next_attempt_at - time.time()
        if wait > 0:
            self._stop.wait(min(wait, 0.5))
            return True
        if not here.items:
            seen = self.feed.head()
            items = self.feed.read(s.workspace_id, s.cursor, PAGE)
            with here.lock:
                if here.s is s:
                    here.items = items
            if not items:
                self.feed.wait(seen, 1.0, self._stop)
            return True
        skipped = list(
            itertools.takewhile(lambda it: it.envelope["type"] not in s.event_types, here.items)
        )
        if skipped:
            here.advance(None, skipped[-1].position, len(skipped))
        elif self._leading.is_set():
            self.deliver(here, s, here.items[0], client)
        return here.s is None or here.s.state == ACTIVE

    def deliver(self, here: Progress, s: Subscription, item: FeedItem, client: Any) -> str:
        """One attempt of ``item`` to ``s``, recorded (a 2xx by the flusher,
        soon; a failure now); its result."""
        request_id = serving.new_request_id()
        webhook_id = str(item.envelope["id"])
        with (
            serving.acting_for(request_id),
            tracing.span(
                "webhook.deliver",
                subscription=str(s.id),
                webhook_id=webhook_id,
                position=item.position,
                attempt=s.attempts + 1,
            ),
        ):
            body = json.dumps(item.envelope).encode()  # as the feed serves it
            now = time.time()
            timestamp = int(now)
            headers = {
                "content-type": "application/json",
                "webhook-id": webhook_id,
                "webhook-timestamp": str(timestamp),
                "webhook-signature": signature_header(
                    webhook_id, timestamp, body, s.secrets_in_use(now), self.key.ring().signing(now)
                ),
                serving.HEADER: request_id,
            }
            parent = tracing.traceparent()
            if parent:
                headers["traceparent"] = parent
            outcome = post(client, s.url, body, headers, self.rules.timeout)
            return self._record(here, s, item, outcome, request_id)

    def _record(
        self, here: Progress, s: Subscription, item: FeedItem, outcome: Outcome, request_id: str
    ) -> str:
        now = time.time()
        result, changes, next_at = decide(s, item, outcome, self.rules, now)
        attempt = Attempt(
            s.id,
            item.position,
            str(item.envelope["id"]),
            s.attempts + 1,
            now,
            result,
            outcome.status,
            outcome.latency_ms,
            outcome.snippet,
            next_at,
            request_id,
        )
        if result == DELIVERED:
            here.advance(attempt, item.position, 1)
            if len(here.unwritten) >= MAX_UNWRITTEN:
                here.flush(self.store)
        else:
            here.flush(self.store, attempt, changes)
        tracing.note(**{"http.status_code": outcome.status, "kandev.result": result})
        metrics.record_background_write("webhooks")
        level = logging.DEBUG if result == DELIVERED else logging.WARNING
        log.log(
            level,
            "webhook %s position=%s attempt=%s %s %s in %.0f ms%s",
            s.id,
            item.position,
            attempt.attempt,
            result,
            _describe(outcome),
            outcome.latency_ms,
            f"; disabled: {changes['reason']}" if "reason" in changes else "",
        )
        return result
