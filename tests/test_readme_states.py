"""The README's state tables ("How it is built") are the tables of orchestrator/states.py."""

from pathlib import Path

from orchestrator.states import MACHINES

README = Path(__file__).resolve().parent.parent / "README.md"


def markdown_table(machine) -> str:
    """One row per from-state (a new row first), its to-states in the order states.py lists them."""
    targets: dict = {}
    for before, after, _ in machine.transitions:
        targets.setdefault(before, [])
        if after not in targets[before]:
            targets[before].append(after)
    lines = ["| from | to |", "|---|---|"]
    for state in [None, *machine.states.values]:
        if state in targets:
            name = "(new row)" if state is None else f"`{state}`"
            lines.append(f"| {name} | {', '.join(f'`{after}`' for after in targets[state])} |")
    return "\n".join(lines)


def test_the_readme_shows_every_state_machine_as_states_py_defines_it():
    text = README.read_text()
    for table, machine in MACHINES.items():
        expected = markdown_table(machine)
        assert f"(`{table}.{machine.column}`):\n\n{expected}\n" in text, (
            f"README.md's table of {table}.{machine.column} differs from orchestrator/states.py; it should read:\n"
            f"{expected}")
