"""The gateway's refusals: an HTTP status with an OpenAI-style error body
``{"error": {"message", "type", "param", "code"}}``, for its own errors and Starlette's alike."""

from __future__ import annotations

from typing import Any

from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse


class GatewayError(Exception):
    """A request the server refuses: HTTP ``status`` with an OpenAI-style error body."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        type: str = "invalid_request_error",
        param: str | None = None,
        code: str | int | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.type = type
        self.param = param
        self.code = code if code is not None else status

    def body(self) -> dict[str, Any]:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}


class BadRequest(GatewayError):
    """A 400: the request asks for something malformed or not implemented; the message says what."""

    def __init__(self, message: str, *, param: str | None = None) -> None:
        super().__init__(400, message, param=param)


async def http_error(request: Request, exc: Exception) -> JSONResponse:
    """Starlette's own refusals (an unknown path, a wrong method) as OpenAI-style bodies too."""
    status = exc.status_code if isinstance(exc, HTTPException) else 500
    message = (
        f"unknown path {request.url.path}" if status == 404 else f"{request.method} {request.url.path}: {exc}"
    )
    return JSONResponse(GatewayError(status, message).body(), status_code=status)


__all__ = ["BadRequest", "GatewayError", "http_error"]
