"""Masking: the values of the secrets a task read are replaced by ``***`` in everything of its
attempt that is stored or streamed (its log, result, error message and traceback).

A value is looked for in the forms a task commonly writes it: as it is, URL-quoted (a password in
a connection URL), base64 (standard and URL-safe, with and without padding: a Basic
authorization header), JSON- and repr-escaped (a value with quotes or backslashes inside a
returned dict or a raised message). Base64 text that merely *contains* a value among other bytes
cannot be recognised, nor can a value the task transformed itself (reversed, hashed, split);
values shorter than ``MIN_LENGTH`` are not masked (replacing every "ab" would hide the log, not
the secret).

A log is masked as it streams: ``Masker.feed`` holds back the end of the text written so far
while it could be the beginning of a value, so a value written in two pieces (two ``write``
calls) is still recognised; ``flush`` gives back what is held at the end of the attempt.

Nothing here imports Django: the worker's child, its in-process host and the local runner share it.
"""

from __future__ import annotations

import base64
import contextlib
import io
import json
import threading
from urllib.parse import quote, quote_plus

MASK = "***"
MIN_LENGTH = 4


def forms(value: str) -> set[str]:
    """The forms of ``value`` a task commonly writes, each to be masked."""
    if not isinstance(value, str) or len(value) < MIN_LENGTH:
        return set()
    raw = value.encode("utf-8", errors="surrogatepass")
    encoded = base64.b64encode(raw).decode()
    urlsafe = base64.urlsafe_b64encode(raw).decode()
    found = {value, quote(value, safe=""), quote(value), quote_plus(value), encoded, encoded.rstrip("="),
             urlsafe, urlsafe.rstrip("="), json.dumps(value)[1:-1], json.dumps(value, ensure_ascii=False)[1:-1],
             repr(value)[1:-1]}
    return {form for form in found if len(form) >= MIN_LENGTH}


class Masker:
    """The values one attempt must not show, and the text it held back while streaming."""

    def __init__(self):
        self._forms: list[str] = []  # longest first: a value inside a longer one is masked as the longer
        self._held = ""
        self._lock = threading.Lock()  # a thread job's log may be written by threads it started

    def __bool__(self) -> bool:
        return bool(self._forms)

    def add(self, value: str) -> None:
        new = forms(value) - set(self._forms)
        if new:
            self._forms = sorted({*self._forms, *new}, key=lambda form: (-len(form), form))

    def mask(self, text):
        """``text`` with every form of every value replaced by ``***`` (anything not a string as it is)."""
        if not self._forms or not isinstance(text, str) or not text:
            return text
        for form in self._forms:
            if form in text:
                text = text.replace(form, MASK)
        return text

    def mask_json(self, text: str | None) -> str | None:
        """A JSON text (a result, metadata) masked; still JSON (a replacement that broke its syntax
        leaves ``"***"`` as the whole value)."""
        if text is None or not self._forms:
            return text
        masked = self.mask(text)
        if masked == text:
            return text
        try:
            json.loads(masked)
        except ValueError:
            return json.dumps(MASK)
        return masked

    def feed(self, text: str) -> str:
        """Stream ``text``: what may be written now, masked; the end that could still become a
        value is held until the next ``feed`` or ``flush``."""
        with self._lock:
            if not self._forms:
                pending, self._held = self._held + text, ""
                return pending
            pending = self.mask(self._held + text)
            hold = self._partial_length(pending)
            self._held = pending[len(pending) - hold:] if hold else ""
            return pending[:len(pending) - hold] if hold else pending

    def flush(self) -> str:
        with self._lock:
            pending, self._held = self.mask(self._held), ""
            return pending

    def _partial_length(self, text: str) -> int:
        """The length of the longest end of ``text`` that begins some form (but is not all of it).
        Only places where a form's first character occurs are tried: a few per write, not one per
        character of every form."""
        longest = 0
        for form in self._forms:
            first, start = form[0], max(len(text) - len(form) + 1, 0)
            place = text.find(first, start)
            while place != -1 and len(text) - place > longest:
                if form.startswith(text[place:]):
                    longest = len(text) - place
                    break
                place = text.find(first, place + 1)
        return longest


class MaskedStream(io.TextIOBase):
    """An attempt's log (or any text stream) written through a masker: what the task prints, logs
    or a shell command writes reaches ``stream`` masked. ``finish`` writes what was held back and
    finishes the stream (an ``AttemptLog`` returns its storage name)."""

    def __init__(self, stream, masker: Masker):
        self.stream, self.masker = stream, masker

    def writable(self) -> bool:
        return True

    def write(self, text: str) -> int:
        if text:
            masked = self.masker.feed(text)
            if masked:
                self.stream.write(masked)
        return len(text or "")

    def flush(self) -> None:
        with contextlib.suppress(AttributeError, ValueError):
            self.stream.flush()

    def fileno_for_subprocess(self) -> int | None:
        """A descriptor a shell command writes to directly, only while nothing is to be masked:
        otherwise its output is read (and masked) line by line."""
        if self.masker or not hasattr(self.stream, "fileno_for_subprocess"):
            return None
        return self.stream.fileno_for_subprocess()

    def release(self) -> None:
        """Write what the masker held back (the end of the attempt's output)."""
        rest = self.masker.flush()
        if rest:
            self.stream.write(rest)

    def finish(self):
        self.release()
        return self.stream.finish()
