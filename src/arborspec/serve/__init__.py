"""The OpenAI-compatible server: `ServeConfig` and `Service` (serve/service.py), the app
(`create_app`, serve/app.py) and its uvicorn host (`serve`, serve/server.py)."""

from .app import create_app
from .server import serve
from .service import ServeConfig, Service

__all__ = ["ServeConfig", "Service", "create_app", "serve"]
