"""The log's side of C2SP tlog-witness (docs/auditing.md, "Witnesses"): the
sequencer, having signed a checkpoint, asks each configured witness
(``KANDEV_LEDGER_WITNESS_URLS``) to cosign it, with a consistency proof from
the size that witness last cosigned, and stores the checkpoint with the
cosignature lines it got. A witness that is down or refuses is logged and
skipped (for RETRY_SECONDS); the checkpoint is signed all the same, and a
verifier that requires that witness then refuses it.

The calls are made after the signing transaction commits, outside any
transaction, each bounded by TIMEOUT_SECONDS; the checkpoint's stored note then
gets the cosignature lines."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence

import httpx
from kandev_es_client.signed_note import NoteError, split_note
from kandev_es_client.witness import SIZE_TYPE, add_checkpoint_body

from kandev_es.errors import InternalError

log = logging.getLogger("kandev_es.ledger")
TIMEOUT_SECONDS = 2.0
RETRY_SECONDS = 30.0
MAX_ANSWER = 4096


class WitnessRefused(InternalError):
    """A witness that did not cosign: why, in words."""


class Witnesses:
    def __init__(self, urls: Sequence[str]) -> None:
        self.urls = tuple(urls)
        self._last: dict[str, int] = {}  # the size each witness last cosigned, as learnt
        self._retry_at: dict[str, float] = {}

    def cosign(self, note: str, size: int, prove: Callable[[int], list[bytes]]) -> str:
        """``note`` with the cosignature lines of every witness that cosigned it."""
        lines = []
        for url in self.urls:
            if time.monotonic() < self._retry_at.get(url, 0.0):
                continue
            try:
                lines.append(self._ask(url, note, size, prove))
            except (httpx.HTTPError, WitnessRefused, NoteError, ValueError) as error:
                log.warning(
                    "ledger: witness %s did not cosign the checkpoint of size %d: %s"
                    " (asked again in %.0f s)",
                    url,
                    size,
                    error,
                    RETRY_SECONDS,
                )
                self._retry_at[url] = time.monotonic() + RETRY_SECONDS
        return note + "".join(lines)

    def _ask(self, url: str, note: str, size: int, prove: Callable[[int], list[bytes]]) -> str:
        old = self._last.get(url, 0)
        for _ in range(2):  # the second time with the size a 409 named
            proof = prove(old) if 0 < old < size else []
            status, content_type, text = _post(
                f"{url}/add-checkpoint", add_checkpoint_body(old, proof, note).encode()
            )
            if status == 409 and content_type.startswith(SIZE_TYPE):
                seen = int(text.strip())
                if seen > size:
                    raise WitnessRefused(
                        f"it cosigned size {seen}, and this log is at {size}: the log was cut"
                        " or forked (a restore?) since it last asked"
                    )
                if seen == old:
                    raise WitnessRefused(f"it cosigned another root at size {seen}: a fork")
                old = seen
                continue
            if status != 200:
                raise WitnessRefused(f"HTTP {status}: {text.strip()[:200]}")
            self._check_line(note, text)
            self._last[url] = size
            return text
        raise WitnessRefused("it kept answering 409")

    @staticmethod
    def _check_line(note: str, text: str) -> None:
        """A witness answers one cosignature line of its own name: a line
        named as a key that signed ``note`` (the log's) would make every
        verifier holding that key refuse the stored checkpoint."""
        _, before = split_note(note)
        _, after = split_note(note + text)  # well-formed, at most 16 lines in all
        if len(after) != len(before) + 1:
            raise WitnessRefused("its answer is not one cosignature line")
        if after[-1].name in {signature.name for signature in before}:
            raise WitnessRefused(
                f"its answer is a signature named {after[-1].name!r}, as the log's own key"
            )


def _post(url: str, body: bytes) -> tuple[int, str, str]:
    """A witness's status, content type and answer, read as it comes: at most
    MAX_ANSWER bytes within about TIMEOUT_SECONDS in all, uncompressed. (A
    whole read of its answer let a witness sending bytes for ever, each within
    the read timeout, hold the sequencer, and so all signing, and its memory.)"""
    deadline = time.monotonic() + TIMEOUT_SECONDS
    headers = {"accept-encoding": "identity"}
    with httpx.stream(
        "POST", url, content=body, headers=headers, timeout=TIMEOUT_SECONDS
    ) as answer:
        raw = b""
        for chunk in answer.iter_raw():
            raw += chunk
            if len(raw) > MAX_ANSWER or time.monotonic() > deadline:
                raise WitnessRefused(
                    f"its answer took over {TIMEOUT_SECONDS:g} s or {MAX_ANSWER} bytes"
                )
        content_type = answer.headers.get("content-type", "")
        return answer.status_code, content_type, raw.decode("utf-8", "replace")
