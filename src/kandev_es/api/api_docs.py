"""The interactive API page at /api/docs: flask-smorest's Swagger UI page over
the service's own /api/openapi.json, with Swagger UI's built files served from
the installed flask-swagger-ui package, so the page loads nothing from another
host (a CDN would be flask-smorest's default). KANDEV_API_DOCS=false leaves both
routes out: /api/docs is then a 404 like any unknown path."""

from __future__ import annotations

from importlib.resources import files
from pathlib import Path

from flask import Blueprint, Flask, Response, request, send_from_directory

PAGE_PATH = "docs"  # under OPENAPI_URL_PREFIX (/api): /api/docs
ASSETS_URL = "/api/docs/assets/"
# Swagger UI's own files; nothing else of the package is used.
ASSETS = ("swagger-ui.css", "swagger-ui-bundle.js", "swagger-ui-standalone-preset.js")
# The page may load only from this server; Swagger UI's start-up script is inline.
CSP = (
    "default-src 'self'; script-src 'self' 'unsafe-inline'; "
    "style-src 'self' 'unsafe-inline'; img-src 'self' data:; connect-src 'self'"
)

blp = Blueprint("api_docs_assets", __name__)


def _dist() -> Path:
    return Path(str(files("flask_swagger_ui") / "dist"))


@blp.route(f"{ASSETS_URL}<name>")
def static(name: str) -> Response:  # named so: api/app.py lets static assets be cached
    if name not in ASSETS:
        return Response(status=404)
    return send_from_directory(_dist(), name, max_age=3600)


def page_config(enabled: bool) -> dict[str, object]:
    """The flask-smorest settings that serve the page (none when it is off)."""
    if not enabled:
        return {}
    return {
        "OPENAPI_SWAGGER_UI_PATH": PAGE_PATH,
        "OPENAPI_SWAGGER_UI_URL": ASSETS_URL,
        # no "valid" badge fetched from the Swagger validator's host
        "OPENAPI_SWAGGER_UI_CONFIG": {"validatorUrl": None},
    }


def register(app: Flask, enabled: bool) -> None:
    if not enabled:
        return
    app.register_blueprint(blp)

    @app.after_request
    def _page_policy(response: Response) -> Response:
        if (request.endpoint or "").endswith(".openapi_swagger_ui"):
            response.headers["Content-Security-Policy"] = CSP
        return response
