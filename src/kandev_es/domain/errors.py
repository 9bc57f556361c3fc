"""Domain rule violations. The service layer translates them to typed API errors."""


class DomainRuleBroken(Exception):
    """A command was issued that the aggregate's current state does not allow."""
