"""A decision, an action or a state: a `str` Enum whose members are their plain words. JSON (the trigger's
event, remedies.jsonl, result.json) carries them as strings, and `Choice.of` reads a string back into the
member, or says what to use instead."""
from __future__ import annotations

import enum
from typing import Any, TypeVar

C = TypeVar("C", bound="Choice")


class Choice(str, enum.Enum):
    def __str__(self) -> str:  # its words in messages and f-strings, not "Action.RETRY"
        return self.value

    @classmethod
    def of(cls: type[C], value: Any, what: str) -> C:
        """`value` (a member or its words) as a member; ValueError naming `what` and the words to use."""
        try:
            return cls(value)
        except ValueError:
            raise ValueError(f"{what} {value!r}: use one of {tuple(m.value for m in cls)}") from None
