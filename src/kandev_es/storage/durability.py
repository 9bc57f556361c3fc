"""Whether an acknowledged write survives losing the database primary, as
the primary itself reports it (docs/operations.md "High availability"): a synchronous
standby is attached (``pg_stat_replication.sync_state`` ``sync`` or
``quorum``) and this service's sessions commit with ``synchronous_commit`` at
least ``on`` (``on`` or ``remote_apply``: the commit waits for the standby's
flush). pg_auto_failover drops synchronous replication when its standby is
lost, so the primary goes on alone and ``durable`` turns false."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from kandev_es.storage.database import Database

# synchronous_commit levels that wait for a synchronous standby's flush.
WAITS_FOR_STANDBY = ("on", "remote_apply")

QUERY = (
    "SELECT current_setting('synchronous_commit'),"
    " current_setting('synchronous_standby_names'),"
    " pg_is_in_recovery(),"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IN ('sync', 'quorum')),"
    " (SELECT count(*) FROM pg_stat_replication WHERE sync_state IS NULL),"
    " quote_ident(current_user)"
)


@dataclass(frozen=True)
class Durability:
    synchronous_commit: str
    synchronous_standby_names: str
    # Standbys the primary waits for now; None when this role may not read
    # pg_stat_replication's sync_state (it needs pg_read_all_stats).
    synchronous_standbys: int | None
    durable: bool | None
    # The role that asked: the grant to run names it. Not in /readyz's answer.
    role: str = field(default="", repr=False)

    def as_dict(self) -> dict[str, Any]:
        found = asdict(self)
        del found["role"]
        return found

    def describe(self) -> str:
        if self.durable:
            return (f"durable: {self.synchronous_standbys} synchronous standby(s)"
                    f" ({self.synchronous_standby_names}), synchronous_commit="
                    f"{self.synchronous_commit}")
        if self.durable is None:
            return (f"durability unknown: role {self.role} cannot read"
                    " pg_stat_replication.sync_state; as a superuser run:"
                    f" GRANT pg_read_all_stats TO {self.role};"
                    f" (synchronous_commit={self.synchronous_commit})")
        standbys = self.synchronous_standbys or 0
        why = (f"synchronous_commit={self.synchronous_commit}"
               if self.synchronous_commit not in WAITS_FOR_STANDBY
               else "no synchronous standby" if not standbys else "")
        return (f"NOT durable ({why}): a commit acknowledged now is lost if this primary"
                " is lost")


def durability(database: Database) -> Durability | None:
    """The primary's replication durability (None on SQLite)."""
    if database.backend != "postgres":
        return None
    with database.transaction() as tx:
        commit, names, in_recovery, sync, hidden, role = tx.execute(QUERY)[0]
    standbys = None if hidden else int(sync)
    if in_recovery:
        durable: bool | None = False
    elif standbys is None:
        durable = None
    else:
        durable = standbys > 0 and str(commit) in WAITS_FOR_STANDBY
    return Durability(str(commit), str(names), standbys, durable, str(role))
