"""The sensors section of ``manage.py bench``: what 10,000 sensors waiting at ``every=60`` cost,
on one worker of concurrency 2 (queue default) beside an idle worker of another queue, a
scheduler and a dispatcher.

In one run, first without sensors and then with them (their first check made: the rows are
written ``sensing``, their next checks spread evenly over the next interval):

- the CPU of every role over the same window (scheduler, dispatcher, the worker's parent and its
  children, the idle worker of the other queue), from ``/proc/PID/stat`` (user + system time);
- the checks made per second (the ``checks`` column, summed) against the rate the sensors ask
  for (10,000 / 60 s: about 167/s), how late the due checks are at the end of the window, and
  how many batches they went in (the worker's own count, on its way out);
- ordinary jobs' start delay (enqueue to the job's first instruction, one job every 50 ms) before
  the sensors and beside them; then in turns with none of them due and with them due again, and
  the ratio of the medians of the two sides (the machine's own noise falls on both alike).
"""

from __future__ import annotations

import json
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from django.db import connection

from orchestrator.bench.core import ROOT, Roles, child_env, reset_work
from orchestrator.states import AttemptOutcome, TaskState

SENSORS = 10_000
EVERY = 60.0
WINDOW_SECONDS = 20.0
JOBS = 100
JOB_INTERVAL = 0.05
TICKS = os.sysconf("SC_CLK_TCK")

# The sensors after their first check, in bulk: runs of one task, each task run "sensing" with its
# try's attempt open (rescheduled) and its next check somewhere in the next interval.
INSERT_RUNS = """
INSERT INTO orchestrator_run (logical_date, trigger, params, tenant, priority, lane, state, reason, payload_hash,
                              created_at, started_at)
SELECT now(), 'job', '{}', 'default', 0, 0, 'running', '', '', now(), now() FROM generate_series(1, %(n)s)
RETURNING id
"""
INSERT_SENSORS = f"""
INSERT INTO orchestrator_taskrun (run_id, task, state, spec, upstream, queue, priority, tenant, lane, attempts,
                                  max_attempts, checks, last_answer, due_at, timeout, error, created_at, started_at)
SELECT id, 'sensor', '{TaskState.SENSING}', %(spec)s::jsonb, '{{}}', 'default', 0, 'default', 0, 1, 1, 1, 'false',
       now() + make_interval(secs => %(every)s * (row_number() OVER (ORDER BY id) - 1) / %(n)s), 60, '', now(), now()
FROM unnest(%(ids)s::bigint[]) AS id
RETURNING id
"""
INSERT_ATTEMPTS = f"""
INSERT INTO orchestrator_attempt (task_run_id, number, outcome, started_at, error, traceback, log_path)
SELECT id, 1, '{AttemptOutcome.RESCHEDULED}', now(), '', '', '' FROM unnest(%(ids)s::bigint[]) AS id
"""
CHECKS = f"SELECT COALESCE(sum(checks), 0) FROM orchestrator_taskrun WHERE task = 'sensor' AND state = '{TaskState.SENSING}'"
# How late the most overdue check is (seconds; 0: none is due), on the index of waiting sensors.
LATE = f"""
SELECT COALESCE(EXTRACT(EPOCH FROM now() - min(due_at)), 0) FROM orchestrator_taskrun
WHERE state = '{TaskState.SENSING}' AND queue = 'default' AND due_at < now()
"""


def _stat(pid: int) -> tuple[int, float] | None:
    """(parent pid, CPU seconds) of a process, or None when it is gone."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    fields = text[text.rindex(")") + 2:].split()
    return int(fields[1]), (int(fields[11]) + int(fields[12])) / TICKS


def _children(pid: int) -> dict[int, float]:
    found = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            stat = _stat(int(entry))
            if stat is not None and stat[0] == pid:
                found[int(entry)] = stat[1]
    return found


class CpuWindow:
    """The CPU each role takes between ``start`` and ``stop`` (percent of one core)."""

    def __init__(self, roles: dict[str, subprocess.Popen]):
        self.roles = roles

    def sample(self) -> dict[str, float | dict]:
        sample = {name: (_stat(proc.pid) or (0, 0.0))[1] for name, proc in self.roles.items()}
        sample["worker children"] = _children(self.roles["worker"].pid)
        return sample

    def start(self) -> None:
        self.began, self.first = time.monotonic(), self.sample()

    def stop(self) -> dict[str, float]:
        last, seconds = self.sample(), time.monotonic() - self.began
        used = {name: last[name] - self.first[name] for name in self.roles}
        # A child that exited meanwhile is left out (the worker recycles none in a window this short).
        before = self.first["worker children"]
        used["worker children"] = sum(cpu - before.get(pid, 0.0) for pid, cpu in last["worker children"].items())
        return {name: 100 * cpu / seconds for name, cpu in used.items()}


def _start(args: list[str], log) -> subprocess.Popen:
    """A role whose records (from INFO) go to ``log``: the worker says on its way out how many
    checks it ran in how many batches."""
    return subprocess.Popen([sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=child_env(LOG_LEVEL="INFO"),
                            stdout=log, stderr=subprocess.STDOUT, start_new_session=True)


def _insert_sensors(n: int, every: float) -> None:
    spec = json.dumps({"kind": "python", "ref": "orchestrator.bench.jobs:not_yet", "timeout": 60,
                       "sensor": {"every": every, "timeout": None}})
    with connection.cursor() as cursor:
        cursor.execute(INSERT_RUNS, {"n": n})
        runs = [row[0] for row in cursor.fetchall()]
        cursor.execute(INSERT_SENSORS, {"ids": runs, "spec": spec, "every": every, "n": n})
        cursor.execute(INSERT_ATTEMPTS, {"ids": [row[0] for row in cursor.fetchall()]})
        cursor.execute("ANALYZE orchestrator_taskrun")


def _scalar(sql: str) -> float:
    with connection.cursor() as cursor:
        cursor.execute(sql)
        return float(cursor.fetchone()[0])


def _start_delays(count: int, interval: float) -> list[float]:
    """Enqueue ``count`` jobs one per transaction every ``interval``; their start delays (ms)."""
    from orchestrator.models import TaskRun
    from orchestrator.runs import create_run

    spec = {"kind": "python", "ref": "orchestrator.bench.jobs:stamp", "call": "job", "args": [], "kwargs": {}}
    enqueued = {}
    for _ in range(count):
        at = time.time()
        run, _ = create_run(None, trigger="job", tasks={"stamp": spec})
        enqueued[run.pk] = at
        time.sleep(interval)
    deadline = time.monotonic() + 60
    done = TaskRun.objects.filter(run_id__in=list(enqueued), state=TaskState.SUCCEEDED)
    while done.count() < count and time.monotonic() < deadline:
        time.sleep(0.1)
    return sorted((result - enqueued[run_id]) * 1000 for run_id, result in done.values_list("run_id", "result"))


def _delay_text(delays: list[float]) -> str:
    if len(delays) < 2:
        return "no job finished"
    q = statistics.quantiles(delays, n=100, method="inclusive")
    return f"p50 {q[49]:.1f} ms, p95 {q[94]:.1f} ms, max {delays[-1]:.1f} ms ({len(delays)} jobs)"


def _cpu_text(cpu: dict[str, float]) -> str:
    return ", ".join(f"{name} {value:.1f}%" for name, value in cpu.items())


def _park(every: float, n: int, parked: bool) -> None:
    """No sensor due for a day, or all due again from now, spread over the interval."""
    with connection.cursor() as cursor:
        if parked:
            cursor.execute(f"UPDATE orchestrator_taskrun SET due_at = now() + interval '1 day' "
                           f"WHERE state = '{TaskState.SENSING}'")
        else:
            cursor.execute(f"""
                UPDATE orchestrator_taskrun t SET due_at = now() + make_interval(secs => %(every)s * (o.rank - 1) / %(n)s)
                FROM (SELECT id, row_number() OVER (ORDER BY id) AS rank FROM orchestrator_taskrun
                      WHERE state = '{TaskState.SENSING}') o
                WHERE t.id = o.id""", {"every": every, "n": n})
    time.sleep(2)


def run(out, sensors: int = SENSORS, every: float = EVERY, window: float = WINDOW_SECONDS, rounds: int = 3) -> None:
    reset_work()
    roles = Roles()
    procs = {}
    log = tempfile.TemporaryFile()
    try:
        procs["scheduler"] = roles.start("scheduler")
        procs["dispatcher"] = roles.start("dispatcher")
        procs["worker"] = _start(["worker", "--queues", "default", "--concurrency", "2", "--grace", "2"], log)
        roles.procs.append(procs["worker"])
        procs["idle worker (other queue)"] = roles.start("worker", "--queues", "other", "--concurrency", "2")
        time.sleep(10)  # set up, children forked, the first heartbeats and polls behind them
        cpu = CpuWindow(procs)

        cpu.start()
        time.sleep(window)
        idle = cpu.stop()
        alone = _start_delays(JOBS, JOB_INTERVAL)
        out(f"  without sensors: CPU {_cpu_text(idle)}")
        out(f"    jobs' start delay: {_delay_text(alone)}")

        _insert_sensors(sensors, every)
        time.sleep(3)
        checks_before = _scalar(CHECKS)
        cpu.start()
        time.sleep(window)
        waiting = cpu.stop()
        rate = (_scalar(CHECKS) - checks_before) / window
        late = _scalar(LATE)
        beside = _start_delays(JOBS, JOB_INTERVAL)
        out(f"  {sensors:,} sensors waiting at every={every:g}: CPU {_cpu_text(waiting)}")
        out(f"    checks: {rate:.0f}/s (the sensors ask for {sensors / every:.0f}/s); the most overdue check "
            f"at the end: {late:.1f} s late")
        out(f"    jobs' start delay beside them: {_delay_text(beside)}")
        # Then in turns without them (none due for a day) and with them again (due from now, spread
        # over the interval as at first), so the machine's own noise falls on both alike: the
        # ratio of the medians of each side's p50s, and each turn's pair.
        pairs = []
        for _ in range(rounds):
            _park(every, sensors, parked=True)
            without = _start_delays(JOBS, JOB_INTERVAL)
            _park(every, sensors, parked=False)
            with_them = _start_delays(JOBS, JOB_INTERVAL)
            if min(len(without), len(with_them)) >= 2:
                pairs.append((statistics.median(with_them), statistics.median(without)))
        if pairs:
            turns = ", ".join(f"{a:.1f}/{b:.1f}" for a, b in pairs)
            ratio = statistics.median(a for a, _ in pairs) / statistics.median(b for _, b in pairs)
            out(f"    start delay p50 with / without sensors, {len(pairs)} turns each way (ms): {turns}; "
                f"median with / median without: x{ratio:.2f}")
    finally:
        roles.stop()
    log.seek(0)
    with log:
        found = re.search(r"\((\d+) waiting sensors' checks in (\d+) batches\)", log.read().decode(errors="replace"))
        if found:
            checks, batches = map(int, found.groups())
            out(f"    the worker ran {checks:,} checks in {batches:,} batches ({checks / max(batches, 1):.1f} per round "
                "trip to a child)")
