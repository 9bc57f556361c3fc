"""Liveness, readiness (with schema attestation and projection lag), metrics."""

from __future__ import annotations

from typing import Any

from flask import Response
from flask.views import MethodView
from flask_smorest import Blueprint
from marshmallow import Schema, fields, validate

from kandev_es import __version__, metrics
from kandev_es.api.context import services
from kandev_es.api.errors import document_errors
from kandev_es.redaction import public_text
from kandev_es.storage.durability import durability
from kandev_es.webhooks import observed

blp = Blueprint("health", __name__, description="Health")


class HealthSchema(Schema):
    status = fields.String(required=True, validate=validate.OneOf(["ok"]))
    # kandev_es.__version__, as `kandev-es --version` prints it.
    version = fields.String(required=True)


class DurabilitySchema(Schema):
    synchronous_commit = fields.String(required=True)
    synchronous_standby_names = fields.String(required=True)
    synchronous_standbys = fields.Integer(
        required=True, allow_none=True,
        metadata={"description": "null: the role may not read pg_stat_replication.sync_state"},
    )
    durable = fields.Boolean(required=True, allow_none=True)


class ReadinessSchema(Schema):
    """/readyz: 200 when ready, 503 (same body) when not."""

    status = fields.String(
        required=True, validate=validate.OneOf(["ready", "degraded", "unready"]),
        metadata={"description": "degraded (200): serving, but the ledger's checkpoints are"
                  " not being signed (`ledger_refused` says why)"},
    )
    backend = fields.String(required=True, validate=validate.OneOf(["sqlite", "postgres"]))
    schema_attested = fields.Boolean(required=True)
    external_id_traffic = fields.String(
        required=True, validate=validate.OneOf(["accepted", "refused"])
    )
    schema_problems = fields.List(fields.String())
    projection_lag = fields.Dict(
        keys=fields.String(), values=fields.Integer(), metadata={"description": "events behind"}
    )
    store_error = fields.String()
    projections_stopped = fields.Dict(
        keys=fields.String(),
        values=fields.String(),
        metadata={"description": "a projection stopped at an event of a topic this version"
                  " does not know (a newer writer's): why; unready until a version that"
                  " knows it runs"},
    )
    ledger_refused = fields.String(
        metadata={"description": "why the sequencer refuses to sign checkpoints: the log in"
                  " the database is not a consistent extension of the last checkpoint it"
                  " signed, or its key is missing (docs/auditing.md)"},
    )
    durability = fields.Nested(
        DurabilitySchema,
        metadata={"description": "PostgreSQL only: does a commit wait for a synchronous standby"},
    )


@blp.route("/healthz")
class Healthz(MethodView):
    @blp.doc(security=[])
    @blp.response(200, HealthSchema)
    @document_errors(blp, 400)
    def get(self) -> dict[str, Any]:
        """Liveness: the process answers

        200 with the version whenever the process serves requests, even when the
        store is down (that is `/readyz`). No token needed.
        """
        return {"status": "ok", "version": __version__}


@blp.route("/readyz")
class Readyz(MethodView):
    @blp.doc(security=[])
    @blp.response(200, ReadinessSchema)
    @blp.alt_response(503, schema=ReadinessSchema, description="not ready")
    @document_errors(blp, 400)
    def get(self) -> Any:
        """Readiness: store reachable and schema attested

        200 when this process can serve creates, else 503 with the same body saying
        which check failed (`store_error`, `schema_problems`); it reports the
        projections' lag too. `degraded` (200): serving, but the ledger's
        checkpoints are not being signed (`ledger_refused`). A load balancer
        routes by it. No token needed.
        """
        svc = services()
        attestation = svc.attestation.refresh()
        report: dict[str, Any] = {
            "backend": svc.database.backend,
            "schema_attested": attestation.ok,
            "external_id_traffic": "accepted" if attestation.ok else "refused",
        }
        if not attestation.ok:
            report["schema_problems"] = attestation.problems
        try:
            report["projection_lag"] = svc.projections.lag()
            found = durability(svc.database)
            if found is not None:  # informational: a primary alone still serves
                report["durability"] = found.as_dict()
            refused = svc.ledger.health()
            if refused is not None:
                report["ledger_refused"] = public_text(refused)
            store_ok = True
        except Exception as error:  # any storage failure makes us unready
            report["store_error"] = public_text(str(error))
            store_ok = False
        stopped = dict(svc.projections.stopped)
        if stopped:
            report["projections_stopped"] = stopped
        ready = attestation.ok and store_ok and not stopped
        report["status"] = ("unready" if not ready
                            else "degraded" if "ledger_refused" in report else "ready")
        return report, 200 if ready else 503


@blp.route("/metrics")
class Metrics(MethodView):
    @blp.doc(
        security=[],
        responses={
            "200": {
                "description": "Prometheus text exposition format 0.0.4",
                "content": {"text/plain": {"schema": {"type": "string"}}},
            }
        },
    )
    @document_errors(blp, 400)
    def get(self) -> Response:
        """Prometheus metrics

        The text exposition format, every worker's values added up: requests by
        route and status, creations, steps, open streams, recoveries. No token
        needed: expose it to the scraper only (see Operations: Metrics).
        """
        found = services()
        body = metrics.exposition(
            found.projections.lag, lambda: observed.families(found.webhooks.store)
        )
        return Response(body, content_type=metrics.CONTENT_TYPE)
