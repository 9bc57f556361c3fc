"""Flask REST adapter: thin handlers over the service layer."""

from kandev_es.api.app import create_app

__all__ = ["create_app"]
