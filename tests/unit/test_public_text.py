"""What /readyz (no token needed) may say about a refusal or a store error."""

from kandev_es.redaction import public_text


def test_an_absolute_path_is_reduced_to_its_file_name() -> None:
    said = public_text("the checkpoint signing key /srv/kandev/data/ledger.key is missing")
    assert said == "the checkpoint signing key ledger.key is missing"


def test_urls_relative_paths_and_commands_are_left_as_they_are() -> None:
    text = "see https://example.com/a/b and docs/auditing.md, then run `kandev-es audit verify`"
    assert public_text(text) == text


def test_secrets_are_redacted_as_in_the_logs() -> None:
    said = public_text("connection to postgresql://app:hunter2@db/kandev failed")
    assert "hunter2" not in said and "postgresql://app:***@db/kandev" in said
