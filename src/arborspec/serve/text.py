"""Token ids to text as they commit, for streaming: never a split UTF-8 character, and never
text that could still turn into a stop string.

`TextStream.push(ids)` returns the text that is final after these tokens. The output is decoded
in a sliding window (the text of the tokens since the last emitted boundary), so each step costs
the window, not the whole output; a window whose text ends in U+FFFD (an incomplete multi-byte
character) waits for the next token. Stop strings cut the text where the first one starts; text
that ends with the beginning of a stop string is held back until the next tokens decide it. The
concatenation of everything `push` and `finish` return is the completion's text, streamed or not.

`StopCheck` is the same rule on the engine side (`DecodeConfig.stopping`): it ends the request at
the token that completes a stop string, so no tokens are generated past it.
"""

from __future__ import annotations

REPLACEMENT = "\ufffd"


def _decode(tokenizer, ids: list[int]) -> str:
    return tokenizer.decode(ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)


class TextStream:
    """One completion's text as its tokens commit (module docstring)."""

    def __init__(self, tokenizer, stop: tuple[str, ...] = ()) -> None:
        self.tokenizer, self.stop = tokenizer, tuple(s for s in stop if s)
        self.ids: list[int] = []
        self.prefix = 0  # window start: the text of ids[prefix:read] is already emitted or held
        self.read = 0
        self.held = ""  # final text not yet emitted: it may begin a stop string
        self.stopped = False  # a stop string was found; nothing more is emitted

    def push(self, ids: list[int]) -> str:
        if self.stopped:
            return ""
        self.ids += ids
        before = _decode(self.tokenizer, self.ids[self.prefix : self.read])
        after = _decode(self.tokenizer, self.ids[self.prefix :])
        if len(after) <= len(before) or after.endswith(REPLACEMENT):
            return ""  # no new complete character yet
        self.prefix, self.read = self.read, len(self.ids)
        return self._release(after[len(before) :])

    def finish(self) -> str:
        """The rest of the text once the request ended (an incomplete character stays as the
        tokenizer decodes it)."""
        if self.stopped:
            return ""
        before = _decode(self.tokenizer, self.ids[self.prefix : self.read])
        after = _decode(self.tokenizer, self.ids[self.prefix :])
        tail = after[len(before) :] if after.startswith(before) else ""
        text = self._release(tail)
        if not self.stopped:
            text, self.held = text + self.held, ""
        return text

    def _release(self, new: str) -> str:
        text = self.held + new
        cuts = [text.find(s) for s in self.stop if s in text]
        if cuts:
            self.stopped, self.held = True, ""
            return text[: min(cuts)]
        keep = max((self._overlap(text, s) for s in self.stop), default=0)
        self.held = text[len(text) - keep :] if keep else ""
        return text[: len(text) - keep]

    @staticmethod
    def _overlap(text: str, stop: str) -> int:
        """The longest end of `text` that is a beginning of `stop`."""
        for n in range(min(len(stop) - 1, len(text)), 0, -1):
            if text.endswith(stop[:n]):
                return n
        return 0


class StopCheck:
    """`DecodeConfig.stopping` for stop strings: True at the token that completes one. It decodes
    the output's last tokens only (enough for the longest stop string); `prompt_len` separates the
    output from the prompt in the sequences it is given."""

    def __init__(self, tokenizer, stop: tuple[str, ...], prompt_len: int) -> None:
        self.tokenizer, self.stop, self.prompt_len = (
            tokenizer,
            tuple(s for s in stop if s),
            prompt_len,
        )
        self.window = 2 * max((len(s) for s in self.stop), default=0) + 4

    def __call__(self, ids: list[int]) -> bool:
        out = ids[self.prompt_len :]
        tail = _decode(self.tokenizer, out[-self.window :])
        return any(s in tail for s in self.stop)
