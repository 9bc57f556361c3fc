"""``kandev-es-verify``: the offline verifier of the client-only distribution.
No server, no database: a proof bundle or a consistency proof, and the log's
public key(s) in a keyring file (``kandev-es audit keyring`` prints one).

    kandev-es-verify bundle BUNDLE.json --keyring KEYRING
    kandev-es-verify consistency PROOF.json --keyring KEYRING
    kandev-es-verify checkpoint CHECKPOINT --keyring KEYRING

Exit status 0: verified; 1: something failed (the report says which event and
why); 2: the files could not be read.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

USAGE_ERROR = 2
VERIFY_EXTRA = "pip install 'kandev-es-client[verify]'"

try:
    from kandev_es_client.ledger import verify_bundle, verify_consistency_bundle
    from kandev_es_client.merkle import ProofError
    from kandev_es_client.signed_note import Keyring, NoteError, parse_keyring
except ModuleNotFoundError as missing:  # the plain client install: httpx only
    if missing.name != "cryptography":
        raise
    print(
        f"kandev-es-verify needs the verify extra (cryptography): {VERIFY_EXTRA}", file=sys.stderr
    )
    raise SystemExit(USAGE_ERROR) from None


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="kandev-es-verify", description="Verify kandev-es history offline."
    )
    parser.add_argument("kind", choices=("bundle", "consistency", "checkpoint"))
    parser.add_argument("file", type=Path)
    parser.add_argument("--keyring", type=Path, required=True,
                        help="the log's verifier keys (one vkey a line, or a JSON keyring)")
    parser.add_argument("--origin", help="the log's origin line, when known")
    return parser


def _run(kind: str, text: str, keyring: Keyring, origin: str | None) -> tuple[bool, list[str]]:
    if kind == "checkpoint":
        checkpoint = keyring.open_checkpoint(text, origin)
        return True, [f"checkpoint {checkpoint.origin} size {checkpoint.size}: signature OK"]
    document: Any = json.loads(text)
    if kind == "consistency":
        old, new = verify_consistency_bundle(document, keyring, origin)
        return True, [f"{old.origin}: size {new.size} extends size {old.size}: OK"]
    report = verify_bundle(document, keyring, origin)
    return report.ok, report.lines()


def main(argv: Sequence[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    try:
        keyring = parse_keyring(args.keyring.read_text(encoding="utf-8"))
        text = args.file.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError, NoteError) as error:
        print(f"kandev-es-verify: {error}", file=sys.stderr)
        return USAGE_ERROR
    try:
        ok, lines = _run(args.kind, text, keyring, args.origin)
    except (NoteError, ProofError, ValueError, KeyError, TypeError) as error:
        ok, lines = False, [f"FAILED: {error}"]
    print("\n".join(lines))
    return 0 if ok else 1


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
