"""The signed links of approvals: a token naming an approval, an answer and the address the
link was sent to, signed with the project's SECRET_KEY (Django's signing), so that whoever got
the email can answer without logging in, and nobody can make a link of their own."""

from __future__ import annotations

from datetime import timedelta

from django.core import signing

SALT = "orchestrator.approvals.link"
# A link stays good this long (an approval's own timeout usually ends it sooner).
MAX_AGE = timedelta(days=30)


class BadLink(ValueError):
    pass


def token(approval_id: int, option: str, recipient: str) -> str:
    return signing.dumps({"a": approval_id, "o": option, "r": recipient}, salt=SALT, compress=True)


def read(value: str) -> tuple[int, str, str]:
    """(approval id, answer, recipient) of a token; BadLink saying what is wrong with it."""
    try:
        data = signing.loads(value, salt=SALT, max_age=MAX_AGE)
        return int(data["a"]), str(data["o"]), str(data["r"])
    except signing.SignatureExpired:
        raise BadLink("this link has expired") from None
    except (signing.BadSignature, KeyError, TypeError, ValueError):
        raise BadLink("this link is not valid (it was changed or cut short)") from None
