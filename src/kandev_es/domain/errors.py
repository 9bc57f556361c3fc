"""Domain rule violations. The service layer translates them to typed API errors."""

from kandev_es.errors import InternalError


class DomainRuleBroken(InternalError):
    """A command was issued that the aggregate's current state does not allow."""
