"""The graph work of the product on the standard library (graphlib and a breadth-first search):
a task cycle named from its first declared task, a loop of data triggers named for each workflow
from that workflow, and the layers the pages draw a graph in."""

from orchestrator.dsl import On, Workflow
from orchestrator.validation import dataset_cycles, validate
from orchestrator.web.svg import layers


def noop(ctx):
    return None


def test_a_task_cycle_is_named_from_the_task_declared_first_along_its_edges():
    wf = Workflow("cyclic")
    a, b, c, d = (wf.task(name=name)(noop) for name in "abcd")
    a >> b >> c >> d
    d >> b  # b -> c -> d -> b
    [error] = validate(wf)
    assert (error.field, error.value) == ("tasks", "b -> c -> d -> b")
    assert error.message == "the graph has a cycle: b -> c -> d -> b"


def producer(name, produces, triggers=()):
    wf = Workflow(name, triggers=[On(dataset) for dataset in triggers])
    wf.task(name="work", produces=produces)(noop)
    return wf


def test_each_workflow_in_a_data_loop_is_told_the_shortest_loop_through_itself():
    workflows = [
        producer("x", ["x_out"], triggers=["z_out"]),
        producer("y", ["y_out"], triggers=["x_out"]),
        producer("z", ["z_out"], triggers=["y_out"]),
        # Consumes x's data but closes no loop.
        producer("bystander", ["b_out"], triggers=["x_out"]),
        # Consumes its own data: validate() reports that; with no other workflow in it, no loop here.
        producer("selfish", ["s_out"], triggers=["s_out"]),
    ]
    found = dataset_cycles(workflows)
    assert set(found) == {"x", "y", "z"}
    assert "data triggers form a loop: x -> x_out -> y -> y_out -> z -> z_out -> x" in found["x"]
    assert "data triggers form a loop: y -> y_out -> z -> z_out -> x -> x_out -> y" in found["y"]
    assert "data triggers form a loop: z -> z_out -> x -> x_out -> y -> y_out -> z" in found["z"]


def test_the_graph_is_drawn_in_layers_of_topological_generations():
    upstream = {"a": [], "b": ["a"], "c": ["a"], "d": ["b", "c"], "e": [], "f": ["d", "missing"]}
    assert layers(upstream) == [["a", "e"], ["b", "c"], ["d"], ["f"]]
    # A cycle (never stored by sync, but a hand-made graph) is still drawn, in one layer.
    assert layers({"a": ["b"], "b": ["a"]}) == [["a", "b"]]
