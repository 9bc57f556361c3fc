"""What `db init` prints for a PostgreSQL URL: the password, in the authority
or a password= parameter, never appears."""

from kandev_es.config import Settings, redact_url


def test_password_in_the_authority_is_masked():
    url = "postgresql://kan:s3cret@db.example:5432/kandev?schema=x"
    assert redact_url(url) == "postgresql://kan:***@db.example:5432/kandev?schema=x"
    assert Settings(database_url=url).location == redact_url(url)


def test_password_parameter_is_masked_and_others_kept():
    masked = redact_url("postgresql://kan@h/db?password=s3cret&sslmode=require")
    assert "s3cret" not in masked
    assert masked == "postgresql://kan@h/db?password=***&sslmode=require"


def test_url_without_a_password_is_unchanged():
    assert redact_url("postgresql://h:5432/db") == "postgresql://h:5432/db"
