"""An identity's id and a feed entry's id are ``uuid.uuid5`` of their names,
whichever function derives them (domain/ids.py): ids stored before and
after must match, or a retry would not find its identity."""

from __future__ import annotations

import copy
import pickle
import uuid

from hypothesis import given
from hypothesis import strategies as st
from kandev_es.projections.feeds import FEED_NAMESPACE, feed_event_id

from kandev_es.domain.external_id import IDENTITY_NAMESPACE, identity_id
from kandev_es.domain.ids import namespace, random_id


@given(st.uuids(), st.text(max_size=300))
def test_a_name_id_is_uuid5_of_the_name(space: uuid.UUID, name: str) -> None:
    made, expected = namespace(space)(name), uuid.uuid5(space, name)
    assert made == expected and hash(made) == hash(expected) and str(made) == str(expected)
    assert (made.version, made.variant, made.is_safe) == (5, uuid.RFC_4122, expected.is_safe)
    assert pickle.loads(pickle.dumps(made)) == made == copy.deepcopy(made)


def test_identity_and_feed_ids_are_the_ones_stored_before() -> None:
    workspace = uuid.UUID("0b5e2f0a-1c2d-4e5f-8a9b-0c1d2e3f4a5b")
    assert identity_id.__wrapped__(workspace, "JIRA-é") == uuid.uuid5(
        IDENTITY_NAMESPACE, f"{workspace}\x00JIRA-é")
    task = uuid.uuid4()
    assert feed_event_id(task, 3) == feed_event_id(str(task), 3) == uuid.uuid5(
        FEED_NAMESPACE, f"{task}:3")


def test_a_random_id_is_a_version_4_uuid_like_uuid4s() -> None:
    made = {random_id() for _ in range(1000)}
    assert len(made) == 1000
    for one in made:
        assert (one.version, one.variant, one.is_safe) == (4, uuid.RFC_4122, uuid.uuid4().is_safe)
        assert uuid.UUID(str(one)) == one and hash(uuid.UUID(str(one))) == hash(one)
