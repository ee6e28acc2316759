from django.urls import path, re_path

from orchestrator.api import (
    actions,
    approvals,
    datasets,
    grants,
    metrics,
    schema,
    secrets,
    task_results,
    views,
)
from orchestrator.api.errors import not_found

app_name = "api"

urlpatterns = [
    path("workflows/", views.WorkflowListView.as_view(), name="workflows"),
    path("workflows/<str:name>/", views.WorkflowDetailView.as_view(), name="workflow"),
    path("workflows/<str:name>/pause/", views.WorkflowPauseView.as_view(), name="workflow-pause"),
    path("workflows/<str:name>/resume/", views.WorkflowResumeView.as_view(), name="workflow-resume"),
    path("workflows/<str:name>/runs/", views.WorkflowRunsView.as_view(), name="workflow-runs"),
    path("runs/", views.RunListView.as_view(), name="runs"),
    path("runs/bulk/", actions.RunBulkView.as_view(), name="runs-bulk"),
    path("runs/<int:pk>/", views.RunDetailView.as_view(), name="run"),
    path("runs/<int:pk>/clear/", actions.RunClearView.as_view(), name="run-clear"),
    path("runs/<int:pk>/mark/", actions.RunMarkView.as_view(), name="run-mark"),
    path("runs/<int:pk>/note/", actions.RunNoteView.as_view(), name="run-note"),
    path("runs/<int:pk>/task-runs/", views.RunTaskRunsView.as_view(), name="run-task-runs"),
    path("runs/<int:pk>/cancel/", views.RunCancelView.as_view(), name="run-cancel"),
    path("runs/<int:pk>/retry/", views.RunRetryView.as_view(), name="run-retry"),
    path("task-runs/<int:pk>/", views.TaskRunDetailView.as_view(), name="task-run"),
    path("task-runs/<int:pk>/result/", task_results.TaskRunResultView.as_view(), name="task-run-result"),
    path("task-runs/<int:pk>/retry/", views.TaskRunRetryView.as_view(), name="task-run-retry"),
    path("task-runs/<int:pk>/clear/", actions.TaskRunClearView.as_view(), name="task-run-clear"),
    path("task-runs/<int:pk>/note/", actions.TaskRunNoteView.as_view(), name="task-run-note"),
    path("task-runs/<int:pk>/mark/", views.TaskRunMarkView.as_view(), name="task-run-mark"),
    path("task-runs/<int:pk>/attempts/<int:number>/log/", views.AttemptLogView.as_view(), name="attempt-log"),
    path("jobs/", views.JobListView.as_view(), name="jobs"),
    path("jobs/<int:pk>/", views.JobDetailView.as_view(), name="job"),
    path("dlq/", views.DeadLetterListView.as_view(), name="dlq"),
    path("dlq/retry/", views.DeadLetterRetryView.as_view(), name="dlq-retry"),
    path("dlq/discard/", views.DeadLetterDiscardView.as_view(), name="dlq-discard"),
    path("backfills/", views.BackfillListView.as_view(), name="backfills"),
    path("backfills/<int:pk>/", views.BackfillDetailView.as_view(), name="backfill"),
    path("audit/", views.AuditListView.as_view(), name="audit"),
    path("approvals/", approvals.ApprovalListView.as_view(), name="approvals"),
    path("approvals/<int:pk>/answer/", approvals.ApprovalAnswerView.as_view(), name="approval-answer"),
    path("dataset-events/", datasets.DatasetEventsView.as_view(), name="dataset-events"),
    path("secrets/", secrets.SecretListView.as_view(), name="secrets"),
    path("secrets/<str:kind>/<str:name>/", secrets.SecretDetailView.as_view(), name="secret"),
    path("metrics/", metrics.MetricsView.as_view(), name="metrics"),
    path("grants/", grants.GrantListView.as_view(), name="grants"),
    path("grants/<int:pk>/", grants.GrantDetailView.as_view(), name="grant"),
    path("schema/", schema.SchemaView.as_view(), name="schema"),
    path("docs/", schema.DocsView.as_view(), name="docs"),
    # Any path at all, a line break in it too ("." stops at one, and "(?s)" cannot be reversed):
    # every answer under the API is JSON.
    re_path(r"^[\s\S]*$", not_found),
]
