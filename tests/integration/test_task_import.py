"""`kandev-es task import FILE` (issue 44 point 6): JSON lines or CSV (`-` for
stdin) created in batches by external ID through the batch service, a summary
table by outcome, --report with one line per item, exit 1 when an item failed,
and the same import again answers every item found."""

from __future__ import annotations

import json

from click.testing import CliRunner

from kandev_es.cli import main
from tests.integration.helpers import task_created_count


def run(settings, monkeypatch, *args, stdin=None):
    monkeypatch.setenv("KANDEV_DATA_DIR", str(settings.data_dir))
    if settings.database_url:
        monkeypatch.setenv("KANDEV_DATABASE_URL", settings.database_url)
    else:
        monkeypatch.delenv("KANDEV_DATABASE_URL", raising=False)
    return CliRunner().invoke(main, list(args), input=stdin, catch_exceptions=False)


def test_a_json_lines_import_reports_each_item_and_a_rerun_finds_them_all(
    settings, services, workspace, monkeypatch, tmp_path
):
    source = tmp_path / "export.jsonl"
    lines = [json.dumps({"external_id": f"GH-{n}", "title": f"issue {n}"}) for n in range(12)]
    source.write_text("\n".join(lines) + "\n\n")
    report = tmp_path / "report.jsonl"
    first = run(
        settings,
        monkeypatch,
        "task",
        "import",
        str(source),
        "--workspace",
        "acme",
        "--chunk-size",
        "5",
        "--report",
        str(report),
    )
    assert first.exit_code == 0, first.output
    assert "created" in first.stdout and "12" in first.stdout
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert [e["external_id"] for e in entries] == [f"GH-{n}" for n in range(12)]
    assert [e["line"] for e in entries] == list(range(1, 13))
    assert {e["outcome"] for e in entries} == {"created"}
    assert all(e["task_id"] and e["identifier"].startswith("KAN-") for e in entries)
    assert task_created_count(services) == 12
    again = run(
        settings,
        monkeypatch,
        "task",
        "import",
        str(source),
        "--workspace",
        "acme",
        "--report",
        str(report),
    )
    assert again.exit_code == 0, again.output
    rerun = [json.loads(line) for line in report.read_text().splitlines()]
    assert {e["outcome"] for e in rerun} == {"found_settled"}
    assert [e["task_id"] for e in rerun] == [e["task_id"] for e in entries]
    assert task_created_count(services) == 12


def test_a_csv_import_from_stdin_with_failures_exits_1_and_reports_them(
    settings, services, workspace, monkeypatch, tmp_path
):
    csv_text = (
        "external_id,title,description,workflow\n"
        "LIN-1,First,,\n"
        "LIN-2,,no title,\n"
        'LIN-3,Third,"with, a comma",missing\n'
        "LIN-1,First again,,\n"
    )
    report = tmp_path / "report.jsonl"
    result = run(
        settings,
        monkeypatch,
        "task",
        "import",
        "-",
        "--format",
        "csv",
        "--workspace",
        "acme",
        "--report",
        str(report),
        stdin=csv_text,
    )
    assert result.exit_code == 1, result.output
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(e["line"], e["outcome"]) for e in entries] == [
        (2, "created"),
        (3, "failed"),
        (4, "failed"),
        (5, "found_settled"),
    ]
    assert entries[1]["error"]["error"] == "validation_failed"
    assert entries[2]["error"]["error"] == "unknown_reference"
    assert entries[3]["task_id"] == entries[0]["task_id"]
    assert task_created_count(services) == 1


def test_unreadable_lines_fail_alone_and_the_rest_is_imported(
    settings, services, workspace, monkeypatch, tmp_path
):
    source = tmp_path / "export.jsonl"
    source.write_text(
        '{"external_id": "J-1", "title": "ok"}\nnot json\n[1]\n'
        '{"external_id": "J-2", "title": "ok"}\n'
    )
    report = tmp_path / "report.jsonl"
    result = run(
        settings,
        monkeypatch,
        "task",
        "import",
        str(source),
        "--workspace",
        "acme",
        "--report",
        str(report),
    )
    assert result.exit_code == 1
    entries = [json.loads(line) for line in report.read_text().splitlines()]
    assert [(e["line"], e["outcome"]) for e in entries] == [
        (1, "created"),
        (2, "failed"),
        (3, "failed"),
        (4, "created"),
    ]
    assert entries[1]["error"] == {"error": "unreadable_line", "message": "not JSON"}
    assert task_created_count(services) == 2


def test_an_unknown_workspace_is_a_usage_error(settings, services, monkeypatch, tmp_path):
    source = tmp_path / "export.jsonl"
    source.write_text('{"title": "t"}\n')
    result = run(settings, monkeypatch, "task", "import", str(source), "--workspace", "nope")
    assert result.exit_code == 2
    assert "no workspace 'nope'" in result.output
    assert task_created_count(services) == 0
