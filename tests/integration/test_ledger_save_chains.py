"""The chain hashes a save writes (docs/auditing.md: Tamper-evident history), on
both backends: in the save's own INSERT whether the previous hash is in the
same save or a stored row, the same as the offline verifier's chain and the
sequencer's log; and with KANDEV_LEDGER_SAVE_CHAINS off (the bench's baseline)
no hash in the save, every event still chained in the log, and db init's
backfill filling the rows so saves with chains back on go on from them."""

from __future__ import annotations

import contextlib
import uuid

import pytest
from eventsourcing.persistence import StoredEvent
from kandev_es_client import ledger as chains

from kandev_es.bootstrap import bootstrap
from kandev_es.services import ledger
from kandev_es.services.ledger_audit import verify_ledger
from kandev_es.storage.ledger import stored_chain_hashes

TOPIC = "tests.chains:Saved"  # no read model applies it; the chain does not care


def save(services, stream: uuid.UUID, versions: range, **kwargs) -> list[int]:
    events = [StoredEvent(originator_id=stream, originator_version=v, topic=TOPIC,
                          state=f"state {v} of {stream}".encode()) for v in versions]
    return list(services.app.recorder.insert_events(events, **kwargs))


def stored(services) -> dict[int, bytes | None]:
    with services.database.transaction() as tx:
        return stored_chain_hashes(tx, services.database.backend,
                                   services.app.recorder.events_table_name)


def expected(stream: uuid.UUID, upto: int) -> list[bytes]:
    return chains.chain(stream, [(v, TOPIC, f"state {v} of {stream}".encode())
                                 for v in range(1, upto + 1)])


def keyring(services):
    return ledger.keyring_of(ledger.load_signer(services.settings))


def test_a_stream_that_goes_on_is_chained_from_its_stored_event_in_the_save(services):
    stream, other = uuid.uuid4(), uuid.uuid4()
    positions = save(services, stream, range(1, 3))  # previous hashes all in the save
    # previous stored (v2), then earlier in the same save (v4 after v3), beside a new stream
    positions += save(services, stream, range(3, 5), unchanged={other: 0})
    positions += save(services, other, range(1, 2))
    positions += save(services, stream, range(5, 6))

    rows = stored(services)
    assert [rows[p] for p in positions[:4] + positions[5:]] == expected(stream, 5)
    assert rows[positions[4]] == expected(other, 1)[0]
    services.ledger.catch_up()
    report = verify_ledger(services.app, services.database, keyring(services))
    assert report.ok, report.problems  # the log's own chain agrees with the saved one


def test_with_save_chains_off_the_log_still_chains_and_db_init_fills_the_rows(
    services, settings
):
    stream = uuid.uuid4()
    unchained = bootstrap(settings.with_overrides(ledger_save_chains=False))
    try:
        positions = save(unchained, stream, range(1, 3))
        assert [stored(unchained)[p] for p in positions] == [None, None]
        unchained.ledger.catch_up()
        assert verify_ledger(unchained.app, unchained.database, keyring(unchained)).ok
    finally:
        unchained.close()

    positions += save(services, stream, range(3, 4))  # goes on from a row with no hash
    assert stored(services)[positions[-1]] is None
    services.ledger.catch_up()
    services.ledger.fill_chains()  # db init's backfill, from the log
    positions += save(services, stream, range(4, 5))  # goes on from a filled row
    assert [stored(services)[p] for p in positions] == expected(stream, 4)


@pytest.mark.postgres_only
def test_a_direct_call_without_hashes_has_every_hash_computed_in_the_statement(services):
    stream = uuid.uuid4()
    with services.database.transaction() as tx:
        tx.execute(
            "SELECT kandev_insert_events(?::uuid[], ?::bigint[], ?::text[], ?::bytea[],"
            " '{}'::uuid[], '{}'::bigint[])",
            ([stream, stream], [1, 2], [TOPIC, TOPIC],
             [f"state {v} of {stream}".encode() for v in (1, 2)]),
        )
    assert sorted(h for h in stored(services).values() if h in expected(stream, 2)) == sorted(
        expected(stream, 2))


@pytest.mark.parametrize("signs", [False, True], ids=["appends", "appends-and-signs"])
def test_a_sequencer_pass_makes_the_same_statements_for_ten_events_as_for_three_hundred(
    services, monkeypatch, signs
):
    """The sequencer keeps up with the saves only while a pass's round trips do
    not grow with its events (a statement per event once made it 4x slower);
    a pass that signs a checkpoint also brings the map of stream heads up to
    date, in as many statements for 100 streams as for 5."""
    counted: list[str] = []
    database = services.ledger.database

    def counting(transaction):
        def wrapped():
            with transaction() as tx:
                for name in ("execute", "executemany"):
                    method = getattr(tx, name)
                    setattr(tx, name, lambda *a, _m=method, _n=name, **k: (
                        counted.append(_n), _m(*a, **k))[1])
                yield tx
        return contextlib.contextmanager(wrapped)

    monkeypatch.setattr(database, "transaction", counting(database.transaction))
    # No checkpoint falls due in either pass (catch_up below signs one), or one
    # is due at every event.
    monkeypatch.setattr(services.ledger, "settings", services.settings.with_overrides(
        ledger_checkpoint_seconds=3600.0, ledger_checkpoint_events=1 if signs else 10**6))

    def pass_statements(streams: int, versions: int) -> int:
        services.ledger.catch_up()  # what earlier tests or saves left
        for _ in range(streams):
            stream = uuid.uuid4()
            save(services, stream, range(1, 2))  # a stream that goes on in the pass below
            save(services, stream, range(2, versions + 1))
        counted.clear()
        assert services.ledger.run_once() == streams * versions
        return len(counted)

    save(services, uuid.uuid4(), range(1, 2))  # so neither pass starts the tree
    few = pass_statements(5, 2)
    many = pass_statements(100, 3)
    if services.database.backend == "postgres":
        assert many == few
    elif not signs:  # in process: a lookup per stream that goes on is cheap
        assert many - few == 100 * 2 - 5 * 1
