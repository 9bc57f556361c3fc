"""What `db init` prints when the role cannot see whether a standby is
synchronous: the exact grant to run, naming the role (issue 38)."""

from kandev_es.storage.durability import Durability


def test_unknown_durability_names_the_grant_to_run_for_this_role():
    found = Durability("on", "ANY 1 (node_2)", None, None, role="kandev")
    line = found.describe()
    assert "as a superuser run: GRANT pg_read_all_stats TO kandev;" in line
    assert "role" not in found.as_dict()  # /readyz carries no role name
