from django.contrib.auth import views as auth_views
from django.urls import path, register_converter

from orchestrator.web import (
    actions,
    approvals,
    audit,
    calendar,
    code,
    dashboard,
    dead_letter,
    lineage,
    preferences,
    results,
    runs,
    task_runs,
    workflows,
)


class StoredName:
    """Any workflow name a row may hold. Sync stores only names fit for a URL now, but a row from
    before may have a slash in its name, or none at all: its pages still work, and reversing its
    URLs (on every page that lists it) never fails."""

    regex = ".*"

    def to_python(self, value: str) -> str:
        return value

    def to_url(self, value: str) -> str:
        return value


register_converter(StoredName, "stored_name")

app_name = "web"

urlpatterns = [
    path("", dashboard.dashboard, name="dashboard"),
    path("login/", auth_views.LoginView.as_view(template_name="orchestrator/login.html", redirect_authenticated_user=True,
                                                next_page="orchestrator:web:dashboard"), name="login"),
    path("logout/", auth_views.LogoutView.as_view(next_page="orchestrator:web:login"), name="logout"),
    path("workflows/", workflows.workflow_list, name="workflows"),
    # The actions come first, so "a/b/trigger/" is the trigger of "a/b" (see StoredName).
    path("workflows/<stored_name:name>/trigger/", workflows.workflow_trigger, name="workflow_trigger"),
    path("workflows/<stored_name:name>/pause/", workflows.workflow_pause, name="workflow_pause"),
    path("workflows/<stored_name:name>/resume/", workflows.workflow_resume, name="workflow_resume"),
    path("workflows/<stored_name:name>/backfill/", workflows.workflow_backfill, name="workflow_backfill"),
    path("workflows/<stored_name:name>/calendar/", calendar.workflow_calendar, name="workflow_calendar"),
    path("workflows/<stored_name:name>/code/", code.workflow_code, name="workflow_code"),
    path("workflows/<stored_name:name>/", workflows.workflow_detail, name="workflow"),
    path("runs/", runs.run_list, name="runs"),
    path("runs/bulk/", actions.runs_bulk, name="runs_bulk"),
    path("runs/<int:run_id>/", runs.run_detail, name="run"),
    path("runs/<int:run_id>/clear/", actions.run_clear, name="run_clear"),
    path("runs/<int:run_id>/mark/<str:state>/", actions.run_mark, name="run_mark"),
    path("runs/<int:run_id>/note/", actions.run_note, name="run_note"),
    path("runs/<int:run_id>/cancel/", runs.run_cancel, name="run_cancel"),
    path("runs/<int:run_id>/retry/", runs.run_retry, name="run_retry"),
    path("task-runs/<int:task_run_id>/", task_runs.task_run_detail, name="task_run"),
    path("task-runs/<int:task_run_id>/instances/", task_runs.mapped_instances, name="mapped_instances"),
    path("task-runs/<int:task_run_id>/clear-options/", actions.task_run_clear, name="task_run_clear"),
    path("task-runs/<int:task_run_id>/note/", actions.task_run_note, name="task_run_note"),
    path("task-runs/<int:task_run_id>/result/", results.task_run_result, name="task_run_result"),
    path("task-runs/<int:task_run_id>/<str:action>/", task_runs.task_run_action, name="task_run_action"),
    path("attempts/<int:attempt_id>/log/", task_runs.attempt_log, name="attempt_log"),
    path("attempts/<int:attempt_id>/log/download/", task_runs.attempt_log_download, name="attempt_log_download"),
    path("dead-letter/", dead_letter.dead_letter, name="dead_letter"),
    path("approvals/", approvals.waiting_page, name="approvals"),
    path("approvals/<int:approval_id>/answer/", approvals.answer_view, name="approval_answer"),
    path("approvals/answer/<str:token>/", approvals.link_view, name="approval_link"),
    path("audit/", audit.audit_log, name="audit"),
    path("datasets/", lineage.dataset_list, name="datasets"),
    path("dataset/", lineage.dataset_named, name="dataset_named"),
    path("dataset/event/", lineage.dataset_event, name="dataset_event"),
    # The address of the first links: a plain name still reaches its page there.
    path("datasets/<stored_name:name>/", lineage.dataset_detail, name="dataset"),
    path("preferences/clock/", preferences.clock_choice, name="clock"),
]
