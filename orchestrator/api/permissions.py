"""The API's permissions are the web UI's: viewers read, operators also change things."""

from rest_framework.permissions import SAFE_METHODS, BasePermission

from orchestrator import access


class ViewerReadsOperatorWrites(BasePermission):
    message = "reading needs the Viewers or Operators group; changing anything needs Operators"

    def has_permission(self, request, view):
        if request.method in SAFE_METHODS:
            return access.is_viewer(request.user)
        return access.is_operator(request.user)


class OperatorsOnly(BasePermission):
    message = "this needs the Operators group"

    def has_permission(self, request, view):
        return access.is_operator(request.user)
