"""A Python client for the kandev-es HTTP API (httpx).

`create_task` is safe to call again: it resends the very same body with the same
external ID, which the server answers with the task already created, so a retry
never makes a second task. Other writes are sent once (release resends only with
the caller's own operation id, which the server replays)."""

from __future__ import annotations

import json
import time
import uuid
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
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

    def _retrying(
        self,
        method: str,
        path: str,
        *,
        timeout: float | None = None,
        deadline: float | None = None,
        retry_codes: frozenset[str] = frozenset(),
        **kwargs: Any,
    ) -> tuple[httpx.Response, int]:
        """Resend the identical request on 502/503/504, connection errors and
        answers whose error code is in ``retry_codes``, honouring Retry-After,
        never sleeping past the deadline (``timeout`` and ``deadline``: this
        call's own, instead of the client's)."""
        ends = time.monotonic() + (self.deadline if deadline is None else deadline)
        delay = self.backoff
        attempts = 0
        while True:
            attempts += 1
            response: httpx.Response | None = None
            failure: Exception | None = None
            # An attempt may not outlast the deadline either (a server that hangs).
            remaining = max(ends - time.monotonic(), 0.001)
            attempt = self.timeout if timeout is None else timeout
            try:
                response = self._send(method, path, timeout=min(attempt, remaining), **kwargs)
                if response.status_code not in RETRY_STATUSES and (
                    not retry_codes or _code(response) not in retry_codes
                ):
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

    def create_many(
        self,
        workspace_id: str,
        items: Iterable[Mapping[str, Any]],
        *,
        chunk_size: int = 500,
        max_chunk_bytes: int = 900_000,
        atomic: bool = False,
        key_prefix: str | None = None,
        chunk_timeout: float = 120.0,
    ) -> Iterator[BatchItem]:
        """Create many tasks (POST /api/v1/tasks/batch), ``chunk_size`` items
        and at most ``max_chunk_bytes`` of JSON a request (below the server's
        KANDEV_MAX_BODY_BYTES, 1 MiB by default), and yield one ``BatchItem``
        per item, in order, as each chunk is answered. Each chunk is sent with
        an Idempotency-Key (``key_prefix``-<chunk number>; a fresh prefix per
        call by default) and resent with it after a 502/503/504, a lost
        connection or a 409 batch_in_progress, so a chunk whose answer was
        lost is replayed, never made twice. A chunk the server refuses whole
        (413, an atomic chunk's 422) yields each of its items failed with that
        error; any other refusal (404: the workspace) raises ClientError."""
        prefix = key_prefix or uuid.uuid4().hex
        start = 0
        for number, chunk in enumerate(_chunks(items, chunk_size, max_chunk_bytes)):
            body = {"workspace_id": workspace_id, "tasks": chunk, "atomic": atomic}
            response, _ = self._retrying(
                "POST",
                "/tasks/batch",
                content=_compact(body),
                headers={"Idempotency-Key": f"{prefix}-{number}",
                         "Content-Type": "application/json"},
                timeout=chunk_timeout,
                deadline=max(self.deadline, 4 * chunk_timeout),
                retry_codes=frozenset({"batch_in_progress"}),
            )
            yield from _batch_items(response, start, len(chunk))
            start += len(chunk)

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


@dataclass(frozen=True)
class BatchItem:
    """One item of ``Client.create_many``: its place in the items given, what
    the server answered for it (``outcome``: an Outcome's value, or "failed"),
    and the task or the error."""

    index: int
    outcome: str
    status: int
    task: dict[str, Any] | None = None
    error: dict[str, Any] | None = None

    @property
    def failed(self) -> bool:
        return self.task is None


def _compact(body: Any) -> bytes:
    return json.dumps(body, separators=(",", ":")).encode()


def _chunks(
    items: Iterable[Mapping[str, Any]], size: int, max_bytes: int
) -> Iterator[list[Mapping[str, Any]]]:
    """The items in order, ``size`` at most a chunk and at most ``max_bytes``
    of their JSON (an item larger than that goes alone: the server says 413)."""
    chunk: list[Mapping[str, Any]] = []
    used = 0
    for item in items:
        weight = len(_compact(item)) + 1
        if chunk and (len(chunk) >= size or used + weight > max_bytes):
            yield chunk
            chunk, used = [], 0
        chunk.append(item)
        used += weight
    if chunk:
        yield chunk


def _code(response: httpx.Response) -> str | None:
    body = _body(response) if response.status_code >= 400 else None
    return body.get("error") if isinstance(body, dict) else None


def _batch_items(response: httpx.Response, start: int, count: int) -> Iterator[BatchItem]:
    if response.status_code in (413, 422):
        error = ClientError.of(response)
        body: dict[str, Any] = (
            error.body if isinstance(error.body, dict) else {"error": str(error.body)}
        )
        failures = {
            int(failure["index"]): failure
            for failure in body.get("details", {}).get("failures", [])
            if isinstance(failure, dict)
        }
        for index in range(count):
            own = failures.get(index, body)
            yield BatchItem(start + index, "failed", error.status, error=own)
        return
    for result in _ok(response)["results"]:
        task = result.get("result")
        yield BatchItem(
            start + int(result["index"]), result["outcome"], int(result["status"]),
            task=task, error=result.get("error"),
        )


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
