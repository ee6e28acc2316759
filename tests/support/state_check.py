"""Checks every SQL statement and every ORM state update of the product against the state table
of ``orchestrator.states`` (used by tests/test_states.py, and by conftest's database trigger).
The names of triggers and lanes are held to the same rule as states: taken from
``orchestrator.states``, never written out in SQL or compared as literals in Python; and the
product imports them from that one module, not through ``orchestrator.models``.

Two ways of finding statements, because neither alone sees them all:

* the source, read with ``ast``: every string constant of the product that is SQL (module level,
  inside functions, f-string parts) and every ORM ``.update(state=…)`` call with the filter it
  is chained to. A state name must never be written out in SQL source: it comes from the state
  module, formatted in when the module is imported.
* the formatted text: every module-level SQL constant, read from the imported module, so the
  state names that were formatted in are checked against the transitions the table allows.

What this cannot see (SQL assembled at run time from parameters, ``SET state = %s``) is checked
while the suite runs by a trigger in the test database (``transition_trigger_sql``), which
rejects any transition outside the table, whatever code made it.
"""

from __future__ import annotations

import ast
import importlib
import re
from dataclasses import dataclass
from pathlib import Path

from orchestrator import states
from orchestrator.states import MACHINES

ROOT = Path(__file__).resolve().parents[2]
PRODUCT = ROOT / "orchestrator"
# Tooling, not the product: the benchmarks seed rows in any state on purpose.
NOT_PRODUCT = ("migrations", "bench")

ALL_NAMES = {value for machine in MACHINES.values() for value in machine.states.values}
TRIGGER_NAMES = set(states.Trigger.values)
LANE_VALUES = set(states.Lane.values)
# Columns (SQL) and attributes or arguments (Python) that hold a trigger or a lane.
NAMED = {"trigger": TRIGGER_NAMES, "lane": LANE_VALUES}
# What orchestrator.states defines: imported from there, never through orchestrator.models.
STATE_MODULE_NAMES = {name for name, value in vars(states).items() if not name.startswith("_") and (
    getattr(value, "__module__", None) == states.__name__ or isinstance(value, tuple | list | dict | frozenset))}
SQL_WORDS = re.compile(r"\b(SELECT|UPDATE|INSERT\s+INTO|DELETE\s+FROM)\b", re.IGNORECASE)
TABLE_NAMES = re.compile(r"\borchestrator_(\w+)\b")
CHOICES = {"TaskState": states.TaskState, "RunState": states.RunState, "AttemptOutcome": states.AttemptOutcome,
           "WorkerState": states.WorkerState, "State": states.WorkerState}
ORM_MODELS = {"Run": "orchestrator_run", "TaskRun": "orchestrator_taskrun", "Attempt": "orchestrator_attempt",
              "Worker": "orchestrator_worker", "DeadTaskRun": "orchestrator_taskrun"}


@dataclass
class Problem:
    where: str
    message: str

    def __str__(self):
        return f"{self.where}: {self.message}"


def product_files() -> list[Path]:
    return sorted(p for p in PRODUCT.rglob("*.py")
                  if not any(part in NOT_PRODUCT or part.startswith("bench") for part in p.relative_to(PRODUCT).parts))


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def is_sql(text: str) -> bool:
    return bool(SQL_WORDS.search(text)) and "orchestrator_" in text


# --- 1. the source -------------------------------------------------------------------------------

def written_out_names(text: str) -> set[str]:
    """State names quoted in SQL text: they must come from orchestrator.states instead."""
    return {name for name in re.findall(r"'(\w+)'", text) if name in ALL_NAMES}


def _string_parts(node) -> list[str]:
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return [node.value]
    if isinstance(node, ast.JoinedStr):
        return [value.value for value in node.values if isinstance(value, ast.Constant)]
    return []


def written_out_triggers_and_lanes(text: str) -> list[str]:
    """Trigger names and lane numbers that SQL text compares a ``trigger`` or ``lane`` column with."""
    found = []
    for match in re.finditer(r"(?<![\w.])(?:\w+\.)?trigger\s*(?:=|<>|!=|IN|NOT\s+IN)\s*(\([^)]*\)|'\w+')",
                             text, re.IGNORECASE):
        found += [f"trigger '{name}'" for name in sorted(_literals(match.group(1)) & TRIGGER_NAMES)]
    for match in re.finditer(r"(?<![\w.])(?:\w+\.)?lane\s*(?:=|<>|!=|<=|>=|<|>|IN|NOT\s+IN)\s*(\([^)]*\)|\d+)",
                             text, re.IGNORECASE):
        found += [f"lane {number}" for number in re.findall(r"\d+", match.group(1))]
    return found


def source_problems(path: Path, source: str | None = None) -> list[Problem]:
    source = path.read_text() if source is None else source
    tree = ast.parse(source)
    problems = []
    where = str(path.relative_to(ROOT)) if path.is_absolute() else str(path)
    for node in ast.walk(tree):
        parts = _string_parts(node)
        text = "".join(parts)
        if parts and is_sql(text):
            for name in sorted(written_out_names(text)):
                problems.append(Problem(f"{where}:{node.lineno}",
                                        f"SQL names the state '{name}' itself: take it from orchestrator.states"))
            for name in written_out_triggers_and_lanes(text):
                problems.append(Problem(f"{where}:{node.lineno}",
                                        f"SQL names the {name} itself: take it from orchestrator.states"))
        if isinstance(node, ast.Call):
            problems += _orm_update_problems(node, f"{where}:{node.lineno}")
        problems += _named_in_python(node, f"{where}:{getattr(node, 'lineno', 0)}")
    return problems


def _constants(node) -> list:
    """The constant values of an expression: itself, or the items of a literal list, tuple or set."""
    if isinstance(node, ast.Constant):
        return [node.value]
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        return [element.value for element in node.elts if isinstance(element, ast.Constant)]
    return []


def _held(node) -> str | None:
    """``trigger`` or ``lane`` when the expression is such an attribute or variable."""
    name = node.attr if isinstance(node, ast.Attribute) else getattr(node, "id", None)
    return name if name in NAMED else None


def _literal_problems(kind: str, values: list, where: str) -> list[Problem]:
    return [Problem(where, f"{kind} {value!r} is written out: take it from orchestrator.states.{kind.title()}")
            for value in values if value in NAMED[kind] and not isinstance(value, bool)]


def _named_in_python(node, where: str) -> list[Problem]:
    """A trigger name or a lane number written out where Python passes, defaults, compares a trigger
    or a lane (``trigger="manual"``, ``trigger__in=[...]``, ``run.lane == 1``), and a name of the
    state module imported through orchestrator.models."""
    problems = []
    if isinstance(node, ast.Call):
        for keyword in node.keywords:
            kind = (keyword.arg or "").removesuffix("__in")
            if kind in NAMED:
                problems += _literal_problems(kind, _constants(keyword.value), where)
    elif isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
        arguments = node.args.posonlyargs + node.args.args
        defaults = list(zip(arguments[len(arguments) - len(node.args.defaults):], node.args.defaults, strict=True))
        defaults += [(a, d) for a, d in zip(node.args.kwonlyargs, node.args.kw_defaults, strict=True) if d is not None]
        for argument, default in defaults:
            if argument.arg in NAMED:
                problems += _literal_problems(argument.arg, _constants(default), where)
    elif isinstance(node, ast.Compare):
        sides = [node.left, *node.comparators]
        for kind in {_held(side) for side in sides} - {None}:
            for side in sides:
                problems += _literal_problems(kind, _constants(side), where)
    elif isinstance(node, ast.ImportFrom) and node.module == "orchestrator.models":
        for alias in node.names:
            if alias.name in STATE_MODULE_NAMES:
                problems.append(Problem(where, f"{alias.name} is imported from orchestrator.models: import it from "
                                               "orchestrator.states, the one module of state names"))
    return problems


def _resolve(node) -> set[str] | None:
    """The state values an expression of the source stands for, or None if it cannot be told."""
    if isinstance(node, ast.Constant) and isinstance(node.value, str):
        return {node.value}
    if isinstance(node, ast.Attribute):
        # TaskState.DEAD, RunState.RUNNING, Worker.State.LOST, states.TaskState.QUEUED
        owner_node = node.value
        owner = owner_node.attr if isinstance(owner_node, ast.Attribute) else getattr(owner_node, "id", "")
        choices = CHOICES.get(owner)
        value = getattr(choices, node.attr, None) if choices is not None else None
        return {str(value)} if isinstance(value, str) else None
    if isinstance(node, ast.Name):
        value = getattr(states, node.id, None)
        if isinstance(value, tuple | list | frozenset):
            return {str(v) for v in value}
        return None
    if isinstance(node, ast.List | ast.Tuple | ast.Set):
        values = set()
        for element in node.elts:
            if isinstance(element, ast.Starred):
                inner = _resolve(element.value)
            else:
                inner = _resolve(element)
            if inner is None:
                return None
            values |= inner
        return values
    return None


def _chain(call: ast.Call) -> tuple[str | None, list[ast.Call]]:
    """The model at the root of ``Model.objects.filter(...)...update(...)`` and the calls before."""
    calls = []
    node = call.func.value if isinstance(call.func, ast.Attribute) else None
    while node is not None:
        if isinstance(node, ast.Call):
            calls.append(node)
            node = node.func.value if isinstance(node.func, ast.Attribute) else None
        elif isinstance(node, ast.Attribute):
            if node.attr == "objects" and isinstance(node.value, ast.Name):
                return node.value.id, calls
            node = node.value
        else:
            break
    return None, calls


def _orm_update_problems(call: ast.Call, where: str) -> list[Problem]:
    problems = []
    is_method = isinstance(call.func, ast.Attribute)
    for keyword in call.keywords:
        if keyword.arg not in ("state", "state__in", "outcome", "outcome__in"):
            continue
        if isinstance(keyword.value, ast.Constant) or (
                isinstance(keyword.value, ast.List | ast.Tuple)
                and any(isinstance(e, ast.Constant) for e in keyword.value.elts)):
            if is_method or isinstance(call.func, ast.Name):
                problems.append(Problem(where, f"{keyword.arg}= names a state itself: take it from orchestrator.states"))
    if not (is_method and call.func.attr == "update"):
        return problems
    model, calls = _chain(call)
    table = ORM_MODELS.get(model or "")
    if table is None:
        return problems
    machine = MACHINES[table]
    target = next((k.value for k in call.keywords if k.arg == machine.column), None)
    if target is None:
        return problems
    targets = _resolve(target)
    if targets is None:
        problems.append(Problem(where, f"{model} update to a state that cannot be told from the source: "
                                       "use a name of orchestrator.states"))
        return problems
    sources: set[str] | None = None
    for inner in calls:
        for keyword in inner.keywords:
            if keyword.arg in (machine.column, f"{machine.column}__in"):
                resolved = _resolve(keyword.value)
                if resolved is None:
                    problems.append(Problem(where, f"{model} update guarded by a state that cannot be told "
                                                   "from the source: use a name of orchestrator.states"))
                    return problems
                sources = resolved if sources is None else sources & resolved
    problems += transition_problems(machine, sources, targets, where)
    return problems


def transition_problems(machine, sources: set[str] | None, targets: set[str], where: str) -> list[Problem]:
    problems = []
    names = set(machine.states.values)
    for name in sorted((sources or set()) | targets):
        if name not in names:
            problems.append(Problem(where, f"'{name}' is not a {machine.column} of {machine.table}"))
    unguarded = sources is None
    for before in sorted(names if unguarded else sources & names):
        for after in sorted(targets & names):
            if not machine.allows(before, after):
                problems.append(Problem(where, f"{machine.table}: {before} -> {after} is not in the state table"
                                               + (" (the update has no state guard)" if unguarded else "")))
    return problems


# --- 2. the formatted statements --------------------------------------------------------------------

def module_statements() -> list[tuple[str, str]]:
    """(where, text) of every module-level SQL string of the product, as formatted at import."""
    found = []
    for path in product_files():
        name = module_name(path)
        try:
            module = importlib.import_module(name)
        except Exception as exc:  # noqa: BLE001 - a module that cannot be imported is reported
            found.append((name, f"-- could not import: {exc}"))
            continue
        for attribute, value in vars(module).items():
            if isinstance(value, str) and is_sql(value) and not attribute.startswith("__"):
                found.append((f"{name}.{attribute}", value))
    return found


def _strip_comments(sql: str) -> str:
    return re.sub(r"--[^\n]*", "", sql)


def _top_level_split(text: str, separators: re.Pattern) -> list[tuple[int, int]]:
    """Positions of separator matches at parenthesis depth 0."""
    depth, positions, i = 0, [], 0
    while i < len(text):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth -= 1
        elif ch == "'":
            i = text.index("'", i + 1)
        elif depth == 0:
            match = separators.match(text, i)
            wordy = text[i].isalpha()
            if match and not (wordy and i > 0 and (text[i - 1].isalnum() or text[i - 1] == "_")):
                positions.append((match.start(), match.end()))
                i = match.end()
                continue
        i += 1
    return positions


def _segment(sql: str, start: int) -> str:
    """The text of the statement starting at ``start`` up to the parenthesis that closes it."""
    depth, i = 0, start
    while i < len(sql):
        ch = sql[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                return sql[start:i]
            depth -= 1
        elif ch == "'":
            i = sql.index("'", i + 1)
        i += 1
    return sql[start:]


def _literals(text: str) -> set[str]:
    return set(re.findall(r"'(\w+)'", text))


def _compared(text: str, column: str) -> set[str] | None:
    """The literals ``column`` is compared with (``= 'x'``, ``IN ('x', 'y')``); None if never."""
    found = None
    for match in re.finditer(rf"(?<![\w.])(?:\w+\.)?{column}\s*(=|<>|!=|IN|NOT\s+IN)\s*(\([^)]*\)|'\w+')",
                             text, re.IGNORECASE):
        if match.group(1).upper() in ("=", "IN"):
            found = (found or set()) | _literals(match.group(2))
    return found


def _case_defining(sql: str, column: str) -> str | None:
    """The text of ``CASE ... END AS column`` in the statement, if there is one."""
    match = re.search(rf"\bEND\s+AS\s+{column}\b", sql, re.IGNORECASE)
    if not match:
        return None
    depth, i = 0, match.start()
    for word in reversed(list(re.finditer(r"\b(CASE|END)\b", sql[:match.end()], re.IGNORECASE))):
        depth += 1 if word.group(1).upper() == "END" else -1
        if depth == 0:
            i = word.start()
            break
    return sql[i:match.end()]


def statement_problems(where: str, sql: str) -> list[Problem]:
    sql = _strip_comments(sql)
    problems = []
    tables = {f"orchestrator_{name}" for name in TABLE_NAMES.findall(sql)}
    # Names: every literal compared with a state column must be a state of a table the statement uses.
    for column in ("state", "outcome"):
        machines = [m for m in MACHINES.values() if m.table in tables and m.column == column]
        if not machines:
            continue
        known = set().union(*(m.states.values for m in machines))
        for name in sorted((_compared(sql, column) or set()) - known):
            problems.append(Problem(where, f"'{name}' is compared with {column} but is no {column} of "
                                           f"{', '.join(m.table for m in machines)}"))
    for machine, sources, targets in transitions_of(sql):
        problems += transition_problems(machine, sources, targets, where)
    return problems + insert_problems(where, sql)


def transitions_of(sql: str) -> list[tuple]:
    """(machine, states guarded on or None, states set) of each UPDATE of a table with a state
    machine whose new state can be read from the text."""
    sql = _strip_comments(sql)
    found = []
    for match in re.finditer(r"\bUPDATE\s+(orchestrator_\w+)", sql, re.IGNORECASE):
        machine = MACHINES.get(match.group(1))
        if machine is None:
            continue
        segment = _segment(sql, match.start())
        set_at = re.search(r"\bSET\b", segment, re.IGNORECASE)
        body = segment[set_at.end():]
        ends = _top_level_split(body, re.compile(r"(FROM|WHERE|RETURNING)\b", re.IGNORECASE))
        assignments = body[:ends[0][0]] if ends else body
        rest = body[ends[0][0]:] if ends else ""
        target_expr = None
        commas = [0] + [end for _, end in _top_level_split(assignments, re.compile(r","))] + [len(assignments) + 1]
        for a, b in zip(commas, commas[1:], strict=False):
            item = assignments[a:b - 1].strip()
            assign = re.match(rf"(?:\w+\.)?{machine.column}\s*=\s*(.*)$", item, re.IGNORECASE | re.DOTALL)
            if assign:
                target_expr = assign.group(1)
        if target_expr is None:
            continue
        targets = _literals(target_expr)
        if not targets:
            reference = re.fullmatch(r"\s*\w+\.(\w+)\s*", target_expr)
            case = _case_defining(sql, reference.group(1)) if reference else None
            if case is None:
                continue  # a parameter or a copied value: the database trigger checks it at run time
            targets = set(re.findall(r"\b(?:THEN|ELSE)\s+'(\w+)'", case, re.IGNORECASE))
        found.append((machine, _compared(rest, machine.column), targets))
    return found


def insert_problems(where: str, sql: str) -> list[Problem]:
    """A state written by an INSERT must be a state a row may start in."""
    problems = []
    for match in re.finditer(r"\bINSERT\s+INTO\s+(orchestrator_\w+)[^(]*\(([^)]*)\)", sql, re.IGNORECASE):
        machine = MACHINES.get(match.group(1))
        if machine is None:
            continue
        columns = [c.strip() for c in match.group(2).split(",")]
        if machine.column not in columns:
            continue
        index = columns.index(machine.column)
        after = sql[match.end():]
        values = re.match(r"\s*(VALUES\s*\(|SELECT\b)", after, re.IGNORECASE)
        if not values:
            continue
        body = _segment(after, values.end())
        stop = _top_level_split(body, re.compile(r"(FROM|RETURNING|ON\s+CONFLICT)\b", re.IGNORECASE))
        body = body[:stop[0][0]] if stop else body
        cuts = [0] + [end for _, end in _top_level_split(body, re.compile(r","))] + [len(body) + 1]
        items = [body[a:b - 1].strip() for a, b in zip(cuts, cuts[1:], strict=False)]
        value = _literals(items[index]) if index < len(items) else set()
        for name in sorted(value):
            if not machine.allows(None, name):
                problems.append(Problem(where, f"{machine.table}: a row cannot start in '{name}'"))
    return problems


def all_problems() -> list[Problem]:
    problems = []
    for path in product_files():
        problems += source_problems(path)
    for where, text in module_statements():
        if text.startswith("-- could not import"):
            problems.append(Problem(where, text))
            continue
        problems += statement_problems(where, text)
    return problems


# --- 3. at run time: a trigger in the test database -------------------------------------------------

FIXTURE_SETTING = "orchestrator.test_fixture"


def transition_trigger_sql() -> list[str]:
    """A trigger per table of the state table that rejects, at run time, any insert in a state a
    row may not start in and any change of state the table does not allow. Statements made by the
    tests' own set-up (see conftest) set FIXTURE_SETTING and are let through."""
    statements = [f"""
CREATE OR REPLACE FUNCTION orchestrator_check_transition() RETURNS trigger LANGUAGE plpgsql AS $$
DECLARE
    column_name text := TG_ARGV[0];
    new_state text := to_jsonb(NEW) ->> column_name;
    old_state text;
BEGIN
    IF current_setting('{FIXTURE_SETTING}', true) = 'on' THEN
        RETURN NEW;
    END IF;
    IF TG_OP = 'UPDATE' THEN
        old_state := to_jsonb(OLD) ->> column_name;
        IF old_state = new_state THEN
            RETURN NEW;
        END IF;
    END IF;
    IF NOT (coalesce(old_state, '') || '>' || new_state) = ANY (TG_ARGV[1:]) THEN
        RAISE EXCEPTION 'illegal % change of %: % -> % (not in orchestrator.states)',
            column_name, TG_TABLE_NAME, coalesce(old_state, '(insert)'), new_state
            USING ERRCODE = 'check_violation';
    END IF;
    RETURN NEW;
END
$$"""]
    for machine in MACHINES.values():
        pairs = [f">{state}" for state in sorted(machine.initial)]
        pairs += [f"{before}>{after}" for before, after in sorted(machine.allowed)]
        arguments = ", ".join(f"'{value}'" for value in [machine.column, *pairs])
        statements.append(f"DROP TRIGGER IF EXISTS orchestrator_state_table ON {machine.table}")
        statements.append(
            f"CREATE TRIGGER orchestrator_state_table BEFORE INSERT OR UPDATE OF {machine.column} "
            f"ON {machine.table} FOR EACH ROW EXECUTE FUNCTION orchestrator_check_transition({arguments})"
        )
    return statements
