"""The API of approvals: the open approvals the caller may answer, and answering one. The same
rule as the pages: operators answer, and members of the groups an approval names; of two answers
at once exactly one counts, the other gets a 409 that says who answered what and when."""

from __future__ import annotations

from drf_spectacular.utils import OpenApiResponse
from rest_framework import serializers
from rest_framework.exceptions import NotFound, PermissionDenied
from rest_framework.permissions import IsAuthenticated
from rest_framework.response import Response

from orchestrator import access, approvals
from orchestrator.api import serializers as s
from orchestrator.api.base import APIBase, body, errors, validated
from orchestrator.api.schema import extend_schema
from orchestrator.models import Approval


class ApprovalSerializer(serializers.ModelSerializer):
    class Meta:
        model = Approval
        fields = ["id", "run", "task_run", "workflow", "task", "question", "options", "reject", "form", "groups",
                  "state", "asked_at", "due_at", "answer", "values", "answered_by_name", "answered_via",
                  "answered_at"]


class AnswerSerializer(serializers.Serializer):
    answer = serializers.CharField(max_length=50, help_text="One of the approval's options.")
    form = serializers.DictField(required=False, default=dict, help_text="The values of the approval's form fields.")


class ApprovalListView(APIBase):
    permission_classes = [IsAuthenticated]

    @extend_schema(tags=["approvals"], summary="The open approvals the caller may answer, oldest first",
                   responses={200: ApprovalSerializer(many=True), **errors(401)})
    def get(self, request):
        return Response(ApprovalSerializer(approvals.waiting_for(request.user), many=True).data)


class ApprovalAnswerView(APIBase):
    permission_classes = [IsAuthenticated]

    @extend_schema(tags=["approvals"], summary="Answer an approval: its task ends with the answer and the run goes on",
                   request=AnswerSerializer, responses={
                       200: ApprovalSerializer, **errors(400, 401, 403, 404),
                       409: OpenApiResponse(s.ErrorSerializer, description="answered already (the detail says by "
                                                                           "whom, what and when), or no longer open")})
    def post(self, request, pk):
        approval = Approval.objects.filter(pk=pk).first()
        if approval is None:
            raise NotFound(f"no approval {pk}")
        if not approvals.may_answer(request.user, approval):
            if not access.can_view(request.user, approval):
                raise NotFound(f"no approval {pk}")  # another tenant's: as if there were none
            raise PermissionDenied("only operators and the groups this approval names can answer it")
        data = validated(AnswerSerializer, body(request))
        try:
            answered = approvals.answer(approval.pk, approvals.Answer(
                data["answer"], data["form"], by=request.user, by_name=request.user.get_username(), via="api"),
                request=request)
        except approvals.AnswerRefused as exc:
            return Response({"detail": str(exc), **({key: [value] for key, value in exc.errors.items()})},
                            status=exc.status)
        return Response(ApprovalSerializer(answered).data)
