"""The authenticated agentctl taskCreate route, used by `kandev-es agentctl task
create`: the run credential plus ``X-Kandev-Run-Id``, the one create protocol,
the run's workspace unless the body names one (then it is authorized as usual)."""

from __future__ import annotations

from typing import Any

from flask.views import MethodView
from flask_smorest import Blueprint

from kandev_es.api.context import json_object
from kandev_es.api.office import create_as_run, document_run_create

blp = Blueprint("agentctl", __name__, url_prefix="/api/v1/agentctl", description="agentctl")


@blp.route("/tasks")
class AgentctlTaskCreate(MethodView):
    @document_run_create(blp, "agentctl taskCreate: create a task as an agent run")
    def post(self) -> dict[str, Any]:
        return create_as_run(json_object())
