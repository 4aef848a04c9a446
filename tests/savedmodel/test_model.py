"""Reading a SavedModel as protos: selection, refusal of TF1, names, call graph, save."""

from __future__ import annotations

import os

import pytest
from sm_models import ALIASES, SIGNATURES, run_signature

from tests.tolerances import FLOAT32_REORDERED, assert_close
from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel


def by_alias(model: SavedModel, alias: str) -> str:
    return {a: n for n, a in model.aliases.items()}[alias]


def test_aliases_and_signatures(zoo):
    model = SavedModel.load(zoo)
    assert sorted(model.aliases.values()) == sorted(ALIASES)
    assert all(name in model.functions for name in model.aliases)
    assert set(model.signatures) == set(SIGNATURES)
    wrapper = model.signatures["serving_default"]
    assert wrapper.startswith("__inference_signature_wrapper_serve_")
    # The wrapper calls the traced `serve`, which calls tpu_func.
    (serve,) = model.callees(wrapper)
    assert serve.startswith("__inference_serve_")
    assert model.callees(serve) == {by_alias(model, "tpu_func")}


def test_call_graph(zoo):
    model = SavedModel.load(zoo)
    inner, middle = by_alias(model, "inner"), by_alias(model, "middle")
    outer_direct, outer_indirect = by_alias(model, "outer_direct"), by_alias(model, "outer_indirect")
    assert model.callers(inner) == {outer_direct, middle}
    assert model.callees(outer_indirect) == {middle}
    assert model.reachable(outer_indirect) == {middle, inner}
    sites = model.call_sites(inner)
    assert sorted(caller for caller, _ in sites) == sorted([outer_direct, middle])
    assert {node.op for _, node in sites} == {"StatefulPartitionedCall"}
    # Signatures are called by the top-level graph, which TF Serving runs.
    assert len(model.graph_call_sites(model.signatures["serve_two"])) == 1


def test_control_flow_bodies_are_callees(zoo):
    model = SavedModel.load(zoo)
    control_flow = by_alias(model, "control_flow")
    ops = {node.op for node in model.functions[control_flow].node_def}
    assert {"If", "While"} & ops or {"StatelessIf", "StatelessWhile"} & ops
    bodies = model.callees(control_flow)
    # then/else branches of the cond, cond/body of the while loop
    assert len(bodies) == 4
    assert all(model.callers(body) == {control_flow} for body in bodies)


def test_tags_select_the_meta_graph(zoo):
    assert SavedModel.load(zoo, ["serve"]).meta_graph.meta_info_def.tags == ["serve"]
    with pytest.raises(ConversionError) as err:
        SavedModel.load(zoo, ["serve", "tpu"])
    assert str(err.value) == f"{zoo}: no MetaGraphDef with tags [serve, tpu]; tag sets: [serve]"


def test_missing_directory_and_pb(tmp_path):
    with pytest.raises(ConversionError) as err:
        SavedModel.load(tmp_path / "nope")
    assert str(err.value) == f"{tmp_path / 'nope'}: no such SavedModel directory"
    with pytest.raises(ConversionError) as err:
        SavedModel.load(tmp_path)
    assert str(err.value) == f"{tmp_path}: not a SavedModel (no saved_model.pb)"


def test_tf1_model_is_refused(tf1_model):
    with pytest.raises(ConversionError) as err:
        SavedModel.load(tf1_model)
    assert str(err.value) == f"{tf1_model} is a TF1 SavedModel; tpubuild converts TF2 SavedModels only"


def test_save_links_variables_and_runs_the_same(zoo, tmp_path, inputs):
    out = tmp_path / "copy"
    out.mkdir()
    SavedModel.load(zoo).save(out)
    index = "variables/variables.index"
    assert os.stat(out / index).st_ino == os.stat(zoo / index).st_ino
    for key in SIGNATURES:
        expected, got = run_signature(zoo, key, inputs), run_signature(out, key, inputs)
        assert expected.keys() == got.keys()
        for name in expected:
            # The same graph reloaded; TF's CPU kernels still promise no bit-reproducibility.
            assert_close(got[name], expected[name], FLOAT32_REORDERED, f"{key}.{name}")


def test_save_refuses_a_non_empty_directory(zoo, tmp_path):
    (tmp_path / "junk").write_text("x")
    with pytest.raises(ValueError) as err:
        SavedModel.load(zoo).save(tmp_path)
    assert str(err.value) == f"{tmp_path} is not empty"


def test_add_function_and_unique_name(zoo):
    model = SavedModel.load(zoo)
    name = by_alias(model, "tpu_func")
    fresh = model.unique_name(name)
    assert fresh == f"{name}_1"
    copy = type(model.functions[name])()
    copy.CopyFrom(model.functions[name])
    copy.signature.name = fresh
    model.add_function(copy)
    assert model.functions[fresh].signature.name == fresh
    assert model.unique_name(name) == f"{name}_2"
    assert model.callees(fresh) == model.callees(name)


def test_fresh_node_names_from_a_running_set_are_those_read_from_the_function(zoo):
    """fnedit.fresh_node_name with the caller's running set of names (what the bfloat16
    stage's Casts use) hands out the names it gave when it read the function each time."""
    from tensorflow.core.framework.node_def_pb2 import NodeDef

    from tpubuild.savedmodel import fnedit

    model = SavedModel.load(zoo)
    fdef = max(model.functions.values(), key=lambda f: len(f.node_def))
    read, running = type(fdef)(), type(fdef)()
    read.CopyFrom(fdef)
    running.CopyFrom(fdef)
    taken = fnedit.node_names(running)
    bases = [n.name for n in fdef.node_def][:5] * 3 + ["fresh", "fresh", fdef.signature.input_arg[0].name]
    for base in bases:
        name = fnedit.fresh_node_name(read, base)
        read.node_def.append(NodeDef(name=name, op="NoOp"))
        assert fnedit.fresh_node_name(running, base, taken) == name
        running.node_def.append(NodeDef(name=name, op="NoOp"))
    assert taken == fnedit.node_names(read)
