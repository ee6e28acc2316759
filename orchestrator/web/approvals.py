"""The approvals' pages: "Waiting for you" (the open approvals the user may answer, each with its
question, answers and form), the answer that a page's form posts, and the page a signed link in
an email opens (no login: the link is the right to answer), which asks before it records anything
(a mail scanner that follows links answers nothing)."""

from __future__ import annotations

from django.contrib import messages
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.http import Http404
from django.shortcuts import get_object_or_404, render
from django.urls import reverse
from django.views.decorators.http import require_POST

from orchestrator import access, approvals, clock
from orchestrator.conf import app_settings
from orchestrator.models import Approval
from orchestrator.web.kit import back, page, safe_next


def form_values(approval: Approval, data) -> dict:
    """The form's fields as posted (a checkbox that is not ticked is false)."""
    values = {}
    for name, field in approval.form.items():
        if field.get("type") == "bool":
            values[name] = data.get(f"field-{name}") == "on"
        elif data.get(f"field-{name}", "") != "":
            values[name] = data.get(f"field-{name}")
    return values


def waiting_page(request):
    """Waiting for you: the open approvals this user may answer (operators, or the named groups)."""
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), login_url=app_settings.LOGIN_URL)
    return page(request, "orchestrator/web/approvals.html", {
        "approvals": approvals.waiting_for(request.user)})


@require_POST
def answer_view(request, approval_id):
    if not request.user.is_authenticated:
        return redirect_to_login(request.get_full_path(), login_url=app_settings.LOGIN_URL)
    approval = get_object_or_404(Approval, pk=approval_id)
    if not approvals.may_answer(request.user, approval):
        if not access.can_view(request.user, approval):
            raise Http404("No such approval.")  # another tenant's: as if there were none
        raise PermissionDenied("Only operators and the groups this approval names can answer it.")
    default = reverse("orchestrator:web:run", args=[approval.run_id])
    try:
        approvals.answer(approval.pk, approvals.Answer(
            request.POST.get("answer", ""), form_values(approval, request.POST), by=request.user,
            by_name=request.user.get_username(), via="page"), request=request)
    except approvals.AnswerRefused as exc:
        messages.error(request, f"Your answer was not recorded: {exc}")
        return back(request, safe_next(request, default))
    messages.success(request, f"Recorded: {request.POST.get('answer')} for {approval.task} of run #{approval.run_id}.")
    return back(request, default)


def link_view(request, token):
    """A signed link from an email: GET asks to confirm the answer it names, POST records it."""
    try:
        approval, option, recipient = approvals.read_token(token)
    except approvals.AnswerRefused as exc:
        return render(request, "orchestrator/web/approval_link.html", {"refused": str(exc)}, status=exc.status)
    context = {"approval": approval, "option": option, "recipient": recipient, "now": clock.now(),
               "can_operate": access.can_operate(request.user, approval)}
    if request.method == "POST":
        try:
            approvals.answer(approval.pk, approvals.Answer(option, form_values(approval, request.POST),
                                                          by_name=recipient, via="link"), request=request)
        except approvals.AnswerRefused as exc:
            return render(request, "orchestrator/web/approval_link.html", {**context, "refused": str(exc)},
                          status=exc.status)
        approval.refresh_from_db()
        return render(request, "orchestrator/web/approval_link.html", {**context, "recorded": True})
    if approval.state != Approval.State.OPEN:
        return render(request, "orchestrator/web/approval_link.html",
                      {**context, "refused": approvals.refusal(approval)}, status=409)
    return render(request, "orchestrator/web/approval_link.html", context)
