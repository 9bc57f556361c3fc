"""A Python client for the kandev-es HTTP API (httpx).

`create_task` is safe to call again: it resends the very same body with the same
external ID, which the server answers with the task already created, so a retry
never makes a second task. Other writes are sent once (release resends only with
the caller's own operation id, which the server replays)."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime
from enum import StrEnum
from typing import Any

import httpx

# The version of kandev-es this client belongs to (tests/e2e/test_client_only_install.py
# checks it is kandev_es.__version__).
__version__ = "0.1.0"

RETRY_STATUSES = frozenset({502, 503, 504})


class Outcome(StrEnum):
    CREATED = "created"
    FOUND_SETTLED = "found_settled"
    FOUND_UNSETTLED = "found_unsettled"
    CREATED_IDENTITY_LOST = "created_identity_lost"


@dataclass(frozen=True)
class Creation:
    outcome: Outcome
    task: dict[str, Any]
    attempts: int


REQUEST_ID_HEADER = "X-Request-Id"


class ClientError(Exception):
    """The server answered with an error that retrying will not change.
    ``request_id`` is the id the server gave the request (its error body's
    ``request_id``, else its ``X-Request-Id``): quote it to an operator."""

    def __init__(self, status: int, body: Any, request_id: str | None = None) -> None:
        # The machine-readable code is the error body's ``error`` (api/errors.py).
        code = body.get("error") if isinstance(body, dict) else None
        if isinstance(body, dict) and isinstance(body.get("request_id"), str):
            request_id = body["request_id"]
        shown = f" (request {request_id})" if request_id else ""
        super().__init__(f"{status} {code or ''}: {body}{shown}")
        self.status = status
        self.code = code
        self.body = body
        self.request_id = request_id

    @classmethod
    def of(cls, response: httpx.Response) -> ClientError:
        return cls(response.status_code, _body(response), response.headers.get(REQUEST_ID_HEADER))


class DeadlineExceeded(Exception):
    """Retries ran out of time; the last failure is the cause. ``request_id``:
    the last attempt's, when the server answered it."""

    def __init__(self, message: str, request_id: str | None = None) -> None:
        super().__init__(message + (f" (last request {request_id})" if request_id else ""))
        self.request_id = request_id


@dataclass(frozen=True)
class Event:
    id: str
    event: str
    data: Any


def _retry_after(response: httpx.Response | None, fallback: float) -> float:
    """Seconds the server asked us to wait (delta-seconds or an HTTP date),
    else our own backoff."""
    if response is None:
        return fallback
    value = response.headers.get("Retry-After", "").strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return fallback
    if when.tzinfo is None:
        when = when.replace(tzinfo=UTC)
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


class Client:
    def __init__(
        self,
        base_url: str,
        token: str,
        *,
        timeout: float = 10.0,
        deadline: float = 30.0,
        backoff: float = 0.1,
        max_backoff: float = 2.0,
        event_hooks: Mapping[str, Sequence[Callable[..., Any]]] | None = None,
    ) -> None:
        """``timeout`` bounds one attempt, ``deadline`` a call with its retries
        (no attempt runs or sleeps past it); ``event_hooks`` are httpx's, to log
        or observe every request and response."""
        self._http = httpx.Client(
            base_url=base_url.rstrip("/") + "/api/v1",
            headers={"Authorization": f"Bearer {token}"},
            timeout=timeout,
            event_hooks={name: list(hooks) for name, hooks in (event_hooks or {}).items()},
        )
        self.timeout = timeout
        self.deadline = deadline
        self.backoff = backoff
        self.max_backoff = max_backoff

    def close(self) -> None:
        self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _send(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One attempt, unless it can safely be sent again (the caller decides)."""
        return self._http.request(method, path, **kwargs)

    def _retrying(self, method: str, path: str, **kwargs: Any) -> tuple[httpx.Response, int]:
        """Resend the identical request on 502/503/504 and connection errors,
        honouring Retry-After, never sleeping past the deadline."""
        ends = time.monotonic() + self.deadline
        delay = self.backoff
        attempts = 0
        while True:
            attempts += 1
            response: httpx.Response | None = None
            failure: Exception | None = None
            # An attempt may not outlast the deadline either (a server that hangs).
            remaining = max(ends - time.monotonic(), 0.001)
            try:
                response = self._send(
                    method, path, timeout=min(self.timeout, remaining), **kwargs
                )
                if response.status_code not in RETRY_STATUSES:
                    return response, attempts
            except httpx.TransportError as error:
                failure = error
            # The server's Retry-After is honoured as given; our own backoff is capped.
            wait = _retry_after(response, delay)
            if time.monotonic() + wait >= ends:
                last = None
                if response is not None:
                    failure = ClientError.of(response)
                    last = failure.request_id
                raise DeadlineExceeded(f"gave up after {attempts} attempts", last) from failure
            time.sleep(wait)
            delay = min(delay * 2, self.max_backoff)

    def create_task(
        self, workspace_id: str, title: str, external_id: str | None = None, **fields: Any
    ) -> Creation:
        body: dict[str, Any] = {"workspace_id": workspace_id, "title": title, **fields}
        if external_id is None:
            # Without an external id the create is not idempotent: sent once.
            response, attempts = self._send("POST", "/tasks", json=body), 1
        else:
            body["external_id"] = external_id
            response, attempts = self._retrying("POST", "/tasks", json=body)
        task = _ok(response)
        return Creation(Outcome(task["outcome"]), task, attempts)

    def lookup(self, workspace_id: str, external_id: str) -> dict[str, Any] | None:
        response, _ = self._retrying(
            "GET",
            f"/workspaces/{workspace_id}/tasks/by-external-id",
            params={"external_id": external_id},
        )
        if response.status_code == 404:
            return None
        return _ok(response)

    def get(self, task_id: str) -> dict[str, Any]:
        response, _ = self._retrying("GET", f"/tasks/{task_id}")
        return _ok(response)

    def update(
        self, task_id: str, changes: dict[str, Any], *, revision: int | None = None
    ) -> dict[str, Any]:
        headers = {"If-Match": f'"{revision}"'} if revision is not None else {}
        return _ok(self._send("PATCH", f"/tasks/{task_id}", json=changes, headers=headers))

    def release(self, workspace_id: str, external_id: str, *, operation_id: str) -> dict[str, Any]:
        """Operator release. Retried only with this same operation id, which the
        server replays; never with a fresh one."""
        if not operation_id:
            raise ValueError("release needs a stable operation_id")
        response, _ = self._retrying(
            "DELETE",
            f"/workspaces/{workspace_id}/tasks/by-external-id",
            params={"external_id": external_id},
            headers={"Idempotency-Key": operation_id},
        )
        return _ok(response)

    def feed(
        self, workspace_id: str, after: int | None = None, *, stream_seconds: float | None = None
    ) -> Iterator[Event]:
        """Events from the SSE stream; a dropped or ended connection resumes from
        the last id (Last-Event-ID), so no event is skipped or seen twice.
        Without `stream_seconds` it follows the feed for ever; with it, the feed
        ends (the iterator returns) `stream_seconds` after the call, whether or
        not events keep coming: each connection asks the server to end by then."""
        last = None if after is None else str(after)
        stops = None if stream_seconds is None else time.monotonic() + stream_seconds
        ends = time.monotonic() + self.deadline
        while True:
            params = {} if stops is None else {"max_seconds": _seconds_left(stops)}
            headers = {"Last-Event-ID": last} if last is not None else {}
            wait = self.backoff
            failure: Exception | None = None
            try:
                with self._http.stream(
                    "GET",
                    f"/workspaces/{workspace_id}/events/stream",
                    headers=headers,
                    params=params,
                ) as response:
                    if response.status_code in RETRY_STATUSES:
                        # Busy (all stream slots taken): wait as the server says.
                        response.read()
                        wait = _retry_after(response, self.backoff)
                        failure = ClientError.of(response)
                    elif response.status_code != 200:
                        response.read()
                        raise ClientError.of(response)
                    else:
                        ends = time.monotonic() + self.deadline  # connected: a quiet feed is fine
                        for event in _parse_sse(response.iter_lines()):
                            last = event.id or last
                            ends = time.monotonic() + self.deadline
                            yield event
                            if stops is not None and time.monotonic() >= stops:
                                return
            except httpx.TransportError as error:
                failure = error  # dropped: resume from `last`
            if stops is not None and time.monotonic() + (wait if failure else 0) >= stops:
                return
            # Reconnected within `deadline` of the last connection or event, or not at all.
            if time.monotonic() + wait >= ends:
                last = failure.request_id if isinstance(failure, ClientError) else None
                raise DeadlineExceeded("event stream did not come back", last) from failure
            time.sleep(wait)


def _seconds_left(stops: float) -> float:
    """The server's max_seconds for a connection that must end by ``stops``."""
    return round(max(stops - time.monotonic(), 0.0), 3)


def _parse_sse(lines: Iterator[str]) -> Iterator[Event]:
    fields: dict[str, str] = {}
    data: list[str] = []
    for line in lines:
        if not line:
            if data:
                text = "\n".join(data)
                try:
                    value: Any = json.loads(text)
                except ValueError:
                    value = text
                yield Event(fields.get("id", ""), fields.get("event", "message"), value)
            fields, data = {}, []
            continue
        if line.startswith(":"):
            continue
        name, _, value = line.partition(":")
        value = value.removeprefix(" ")
        if name == "data":
            data.append(value)
        else:
            fields[name] = value


def _body(response: httpx.Response) -> Any:
    try:
        return response.json()
    except ValueError:
        return response.text


def _ok(response: httpx.Response) -> dict[str, Any]:
    if response.status_code >= 400:
        raise ClientError.of(response)
    body: dict[str, Any] = response.json()
    return body
