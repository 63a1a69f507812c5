"""Errors in the OpenAI shape: `{"error": {"message", "type", "param", "code"}}` with the HTTP
status that goes with them."""

from __future__ import annotations


class APIError(Exception):
    """An error the server answers with: status, message, OpenAI error type, code, param."""

    def __init__(
        self,
        status: int,
        message: str,
        type: str = "invalid_request_error",
        code: str | None = None,
        param: str | None = None,
        headers: dict[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status, self.message, self.type = status, message, type
        self.code, self.param, self.headers = code, param, headers or {}

    def body(self) -> dict:
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }


def bad_request(message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(400, message, "invalid_request_error", code, param)


def unsupported(field: str, why: str = "") -> APIError:
    more = f" ({why})" if why else ""
    return bad_request(
        f"'{field}' is not supported by this server{more}: leave it out or use its default",
        field,
        "unsupported_parameter",
    )
