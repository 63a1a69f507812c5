"""The OpenAI-compatible server: `ServeConfig` and `Service` (serve/service.py), the app
(`create_app`, serve/app.py) and its uvicorn host (`serve`, serve/server.py).

Its web packages come with the `serve` extra (common/extras.py): importing this package without
them raises the one line that names it, before any of its modules imports them."""

from ..common.extras import require_serve

require_serve()

from .app import create_app
from .server import serve
from .service import ServeConfig, Service

__all__ = ["ServeConfig", "Service", "create_app", "serve"]
