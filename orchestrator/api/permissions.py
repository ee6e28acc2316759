"""The API's permissions are the web UI's: viewers read, operators also change things. Its
tokens are django-rest-knox's: only a hash (SHA-512) of each token is stored."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension
from drf_spectacular.plumbing import build_bearer_security_scheme_object
from knox.auth import TokenAuthentication as KnoxTokenAuthentication
from knox.models import get_token_model
from rest_framework.exceptions import AuthenticationFailed
from rest_framework.permissions import SAFE_METHODS, BasePermission

from orchestrator import access


class TokenAuthentication(KnoxTokenAuthentication):
    """``Authorization: Token <key>``, checked against the stored hashes. A key that is not plain
    text (bytes that are not UTF-8, a NUL character) is refused as an invalid token, never a 500."""

    def authenticate_credentials(self, token: bytes):
        try:
            text = token.decode("utf-8")
        except UnicodeDecodeError:
            raise AuthenticationFailed("Invalid token.") from None
        if "\x00" in text or not text.isprintable():
            raise AuthenticationFailed("Invalid token.")
        return super().authenticate_credentials(token)


class TokenScheme(OpenApiAuthenticationExtension):
    """The tokens in the OpenAPI schema: the ``tokenAuth`` header scheme, as before they were hashed."""

    target_class = TokenAuthentication
    name = "tokenAuth"

    def get_security_definition(self, auto_schema):
        return build_bearer_security_scheme_object(header_name="Authorization", token_prefix="Token")


def create_token(user) -> str:
    """A new API token of ``user`` that never expires; the key is returned once, only its hash is kept."""
    _, key = get_token_model().objects.create(user=user, expiry=None)
    return key


def revoke_tokens(user) -> int:
    """Delete every API token of ``user``; returns how many there were."""
    return get_token_model().objects.filter(user=user).delete()[0]


class ViewerReadsOperatorWrites(BasePermission):
    """The door: a user with some right to read (or to act) gets in; each view then reads through
    ``access.visible`` and checks the right on the object it acts on."""

    message = ("reading needs the Viewers or Operators group or rights on a tenant; changing anything needs "
               "Operators or operator rights on a tenant")

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS:
            return access.reads_anything(request.user)
        return access.operates_anything(request.user)


class OperatorsOnly(BasePermission):
    message = "this needs the Operators group"

    def has_permission(self, request, view):
        return access.is_operator(request.user)


class TenantOperators(BasePermission):
    """Global operators, and the operators of some tenant or workflow (the view shows each only
    what is theirs)."""

    message = "this needs the Operators group or operator rights on a tenant"

    def has_permission(self, request, view):
        return access.operates_anything(request.user)


class SuperusersOnly(BasePermission):
    message = "this needs a superuser"

    def has_permission(self, request, view):
        user = request.user
        return bool(user and user.is_authenticated and user.is_active and user.is_superuser)
