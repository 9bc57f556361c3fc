"""The hand-over from the projection loop to inline writes (docs/operations.md:
Upgrading). A store written by a version before inline projections has its
read models as far as the loop got; ``hand_over`` (run by ``kandev-es db
init``, before any save of this version) replays the rest through the loop's
own projections, then records in ``inline_projections`` the position from
which the saves write them. Once recorded, never again: events after it are
in the read models already, and replaying them would apply them twice."""

from __future__ import annotations

import time

from kandev_es.projections.runner import ProjectionRunner, is_inline

from kandev_es.errors import StoreUnavailable, UnknownTopic

BATCH = 5000
SETTLE_SECONDS = 60.0


def hand_over(runner: ProjectionRunner) -> dict[str, int]:
    """Each inline projection's hand-over position (recorded now or before)."""
    positions: dict[str, int] = {}
    for projection in runner.projections:
        if not is_inline(projection):
            continue
        name = projection.name
        with runner.database.transaction() as tx:
            rows = tx.execute("SELECT since FROM inline_projections WHERE name = ?", (name,))
        if rows:
            positions[name] = int(rows[0][0])
            continue
        head = runner.app.max_notification_id()
        deadline = time.monotonic() + SETTLE_SECONDS
        while True:
            runner.checkpoint()  # before the transaction (storage/settled.py)
            with runner.database.transaction() as tx:
                read = runner.apply_pending(tx, projection, name, BATCH)
                found = tx.execute(
                    "SELECT position FROM projection_tracking WHERE name = ?", (name,)
                )
                position = int(found[0][0])
                if position >= head:
                    tx.execute(
                        "INSERT INTO inline_projections (name, since) VALUES (?, ?)",
                        (name, position),
                    )
                    break
            if name in runner.stopped:
                raise UnknownTopic(f"projection {name} {runner.stopped[name]}")
            if not read:
                if time.monotonic() > deadline:
                    raise StoreUnavailable(f"projection {name} did not reach the head {head}")
                time.sleep(0.01)  # an older transaction is still open
        positions[name] = position
    return positions
