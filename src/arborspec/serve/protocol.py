"""The request bodies the server takes, checked field by field, and what they ask the engine for.

Fields follow OpenAI's chat and completions APIs. Sampling fields map to arborspec's own
(`temperature`, `top_p`, `seed`, `max_tokens` / `max_completion_tokens`, `stop`); fields arborspec
does not implement are accepted only at their neutral value (`frequency_penalty: 0`,
`logprobs: false`, `n: 1`, ...), and refused with a 400 otherwise, so an answer never silently
ignores what was asked. Unknown fields are refused too. arborspec's own fields: `method`,
`budget`, `lookup` (the request's tree builder, its size and context lookup) and
`speculative: false` (plain decoding for this request); `top_k` as in vLLM.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from .api_errors import bad_request, unsupported

MAX_STOP = 4  # stop strings per request (OpenAI's limit)
MAX_STOP_CHARS = 256
MAX_LOOKUP = 64


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=False)


class StreamOptions(_Strict):
    include_usage: bool = False


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None

    def text(self) -> str:
        if isinstance(self.content, str):
            return self.content
        return "".join(part.text for part in self.content)


# (field, neutral values): accepted at these values only
NEUTRAL: dict[str, tuple] = {
    "frequency_penalty": (None, 0, 0.0),
    "presence_penalty": (None, 0, 0.0),
    "logit_bias": (None, {}),
    "logprobs": (None, False, 0),
    "top_logprobs": (None, 0),
    "n": (None, 1),
    "best_of": (None, 1),
    "echo": (None, False),
    "suffix": (None, ""),
    "tools": (None, []),
    "tool_choice": (None, "none"),
    "parallel_tool_calls": (None, True, False),
    "functions": (None, []),
    "function_call": (None, "none"),
    "response_format": (None, {"type": "text"}),
    "store": (None, False),
    "service_tier": (None, "auto", "default"),
    "modalities": (None, ["text"]),
    "prediction": (None,),
    "audio": (None,),
    "reasoning_effort": (None,),
}


class _Generation(_Strict):
    model: str
    max_tokens: int | None = None
    temperature: float | None = Field(default=None, ge=0.0, le=2.0)
    top_p: float | None = Field(default=None, gt=0.0, le=1.0)
    top_k: int | None = Field(default=None, ge=0)
    stream: bool | None = False
    stream_options: StreamOptions | None = None
    stop: str | list[str] | None = None
    seed: int | None = Field(default=None, ge=0, lt=2**63)
    user: str | None = None
    metadata: dict[str, str] | None = None
    # neutral-only fields (NEUTRAL)
    frequency_penalty: float | None = None
    presence_penalty: float | None = None
    logit_bias: dict[str, float] | None = None
    n: int | None = None
    # arborspec's own
    speculative: bool | None = None
    method: str | None = None
    budget: int | str | None = None
    lookup: int | None = Field(default=None, ge=0, le=MAX_LOOKUP)

    def stops(self) -> tuple[str, ...]:
        stops = [self.stop] if isinstance(self.stop, str) else list(self.stop or [])
        if len(stops) > MAX_STOP:
            raise bad_request(f"at most {MAX_STOP} stop sequences, got {len(stops)}", "stop")
        for s in stops:
            if not s or len(s) > MAX_STOP_CHARS:
                raise bad_request(
                    f"each stop sequence must have 1 to {MAX_STOP_CHARS} characters", "stop"
                )
        return tuple(stops)

    def requested_tokens(self) -> int | None:
        return self.max_tokens

    def check_neutral(self) -> None:
        for name, allowed in NEUTRAL.items():
            if name in self.model_fields_set:
                value = getattr(self, name)
                if value not in allowed:
                    raise unsupported(name, f"only {allowed[1]!r} is" if len(allowed) > 1 else "")
        if self.stream_options is not None and not self.stream:
            raise bad_request("stream_options is only allowed with stream: true", "stream_options")


class ChatRequest(_Generation):
    messages: list[ChatMessage] = Field(min_length=1)
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: int | None = None
    tools: list[Any] | None = None
    tool_choice: Any = None
    parallel_tool_calls: bool | None = None
    functions: list[Any] | None = None
    function_call: Any = None
    response_format: dict[str, Any] | None = None
    store: bool | None = None
    service_tier: str | None = None
    modalities: list[str] | None = None
    prediction: Any = None
    audio: Any = None
    reasoning_effort: Any = None

    def requested_tokens(self) -> int | None:
        a, b = self.max_tokens, self.max_completion_tokens
        if a is not None and b is not None and a != b:
            raise bad_request(
                "max_tokens and max_completion_tokens differ: give one of them",
                "max_completion_tokens",
            )
        return b if b is not None else a

    def conversation(self) -> list[dict]:
        """The messages as the chat template reads them: role, content and, where given, the
        speaker's `name` (templates that render it show it; without a template only the contents
        are joined, as for the roles)."""
        if self.messages[-1].role != "user":
            raise bad_request("the last message must be the user's", "messages")
        roles = {"developer": "system"}
        return [
            {"role": roles.get(m.role, m.role), "content": m.text()}
            | ({"name": m.name} if m.name is not None else {})
            for m in self.messages
        ]


class CompletionRequest(_Generation):
    prompt: str | list[int] | list[str] | list[list[int]]
    logprobs: int | None = None
    echo: bool | None = None
    suffix: str | None = None
    best_of: int | None = None

    def single_prompt(self) -> str | list[int]:
        p = self.prompt
        if isinstance(p, list) and p and isinstance(p[0], (str, list)):
            if len(p) != 1:
                raise bad_request(
                    "one prompt per request: send each prompt as its own request", "prompt"
                )
            p = p[0]
        if not p:
            raise bad_request("the prompt is empty", "prompt")
        return p


def parse(cls: type[_Generation], body: Any) -> _Generation:
    """The body as `cls`, or a 400 naming the first field at fault."""
    if not isinstance(body, dict):
        raise bad_request("the request body must be a JSON object")
    try:
        request = cls.model_validate(body)
    except ValidationError as error:
        first = error.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or None
        kind = first["type"]
        if kind == "extra_forbidden":
            raise unsupported(where or "?", "unknown field") from None
        if kind == "missing":
            raise bad_request(f"'{where}' is required", where) from None
        raise bad_request(f"'{where}': {first['msg']}", where) from None
    request.check_neutral()
    return request
