"""`pyllamaopt serve`: OpenAI-compatible HTTP and the session protocol over one Context."""
from .app import ServeSettings, create_app, serve

__all__ = ["ServeSettings", "create_app", "serve"]
