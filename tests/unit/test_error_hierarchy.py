"""One error hierarchy (errors.py), mapped to HTTP once (errors.http_status): every
exception the package defines descends from ``Failure``; every failure answered
to a caller is a ``KandevError`` defined in errors.py, carries no status of its
own, and keeps the HTTP status it had when each module still set one."""

from __future__ import annotations

import importlib
import inspect

import pytest

from kandev_es import errors
from kandev_es.errors import Failure, InternalError, KandevError, http_status
from tests.unit.test_layers import modules

# The caller's side of the wire (client.py), click's own exception type, and
# the failpoint that stands for an error no code knows (it must stay unknown).
OUTSIDE = {
    "kandev_es_client.ClientError",
    "kandev_es_client.DeadlineExceeded",
    "kandev_es.cli.SettingError",
    "kandev_es.creation.failpoints.FailpointRaised",
}

STATUS = {
    400: "BadRequest MalformedJson MalformedQuery InvalidExternalId ExternalIdImmutable"
    " InvalidCursor MissingOperationId UnknownProjection NotRebuildable InvalidCheckpointRange",
    401: "Unauthenticated",
    403: "OperatorRequired",
    405: "MethodNotAllowed",
    404: "NotFound TaskNotCreated WorkspaceDeleted TaskNotFound WorkspaceNotFound TokenNotFound"
    " IdentityNotFound CreationNotFound CheckpointNotFound WebhookNotFound",
    409: "Conflict WorkspaceExists ReleaseConflict CreationInProgress BranchTaken CapacityExceeded"
    " AttachmentClaimed CreationNotParked WebhookPaused WebhookLimitReached",
    412: "RevisionMismatch",
    413: "PayloadTooLarge",
    422: "ValidationFailed RepositoryNotAllowed RepositoryNotTopLevel UnknownReference"
    " OperationIdReused InvalidWebhookUrl WebhookAddressRefused UnknownEventType",
    429: "TooMany AgentLimitReached",
    500: "KandevError InvalidSetting",
    502: "EffectFailed RepositoryEffectFailed AgentLaunchFailed EffectUnproven"
    " CompensationUnproven",
    503: "Unavailable StreamLimitReached SchemaNotAttested StoreUnavailable CreationHandedOver"
    " UnknownStep UnknownTopic",
}


def defined_exceptions() -> list[type[BaseException]]:
    found = []
    for name in modules():
        module = importlib.import_module(name)
        for _, value in inspect.getmembers(module, inspect.isclass):
            if value.__module__ == name and issubclass(value, BaseException):
                found.append(value)
    return found


def subclasses(root: type) -> set[type]:
    found = set(root.__subclasses__())
    for child in list(found):
        found |= subclasses(child)
    return found


def test_every_exception_the_package_defines_descends_from_failure():
    strays = [
        f"{cls.__module__}.{cls.__qualname__}"
        for cls in defined_exceptions()
        if not issubclass(cls, Failure) and f"{cls.__module__}.{cls.__qualname__}" not in OUTSIDE
    ]
    assert strays == [], "subclass kandev_es.errors.InternalError (or a KandevError in errors.py)"


def test_answered_failures_live_in_errors_py_and_internal_ones_are_not_answered():
    defined_exceptions()  # import every module, so every subclass exists
    answered = {cls for cls in subclasses(KandevError) if cls.__module__.startswith("kandev_es")}
    assert {cls.__module__ for cls in answered} == {"kandev_es.errors"}
    assert not subclasses(InternalError) & answered


@pytest.mark.parametrize("status", sorted(STATUS))
def test_each_failure_keeps_its_http_status(status):
    for name in STATUS[status].split():
        cls = getattr(errors, name)
        assert http_status(cls("x")) == status, name


def test_no_failure_carries_a_status_and_every_family_is_mapped():
    defined_exceptions()
    for cls in {KandevError} | subclasses(KandevError):
        assert "status" not in vars(cls), f"{cls.__name__}: map it in errors.py HTTP_STATUS"
        if cls not in (KandevError, errors.InvalidSetting):
            assert http_status(cls("x")) != 500, f"{cls.__name__} is in no HTTP family"
