"""Resolving tpu_functions: each kind, each error with its exact message."""

from __future__ import annotations

import pytest

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.tpu.functions import resolve_tpu_functions


@pytest.fixture(scope="module")
def model(zoo) -> SavedModel:
    return SavedModel.load(zoo)


def name_of(model: SavedModel, alias: str) -> str:
    return {a: n for n, a in model.aliases.items()}[alias]


def resolve_error(model: SavedModel, entries: list[dict]) -> str:
    with pytest.raises(ConversionError) as err:
        resolve_tpu_functions(model, entries)
    return str(err.value)


ALIAS_LIST = (
    '"control_flow", "dynamic_shape", "f64_in", "inner", "middle", "outer_direct", '
    '"outer_indirect", "sparse_in", "string_in", "string_op", "tpu_b", "tpu_func"'
)


def test_by_function_alias(model):
    (fn,) = resolve_tpu_functions(model, [{"function_alias": "tpu_func"}])
    assert (fn.name, fn.alias, fn.how, fn.label) == (
        name_of(model, "tpu_func"), "tpu_func", 'function_alias "tpu_func"', "tpu_func"
    )


def test_by_concrete_function_name(model):
    name = name_of(model, "tpu_b")
    (fn,) = resolve_tpu_functions(model, [{"concrete_function_name": name}])
    assert (fn.name, fn.alias, fn.how) == (name, "tpu_b", f'concrete_function_name "{name}"')


def test_by_signature_name(model):
    (fn,) = resolve_tpu_functions(model, [{"signature_name": "serve_two"}])
    assert (fn.name, fn.signature, fn.alias) == (model.signatures["serve_two"], "serve_two", None)


def test_jit_compile_functions_takes_only_the_outermost(jit):
    model = SavedModel.load(jit)
    marked = [n for n, f in model.functions.items() if "_XlaMustCompile" in f.attr]
    assert len(marked) == 2
    (fn,) = resolve_tpu_functions(model, [{"jit_compile_functions": True}])
    assert fn.name.startswith("__inference_jit_outer_")
    assert resolve_tpu_functions(model, [{"jit_compile_functions": False}]) == []


def test_two_functions_in_recipe_order(model):
    found = resolve_tpu_functions(model, [{"function_alias": "tpu_b"}, {"function_alias": "tpu_func"}])
    assert [f.alias for f in found] == ["tpu_b", "tpu_func"]


def test_unknown_alias_lists_aliases_and_closest(model):
    assert resolve_error(model, [{"function_alias": "tpu_fnc"}]) == (
        f'tpu_functions[0]: unknown function alias "tpu_fnc" (did you mean "tpu_func"?); aliases: {ALIAS_LIST}'
    )
    assert resolve_error(model, [{"function_alias": "tpu_b"}, {"function_alias": "zzz"}]) == (
        f'tpu_functions[1]: unknown function alias "zzz"; aliases: {ALIAS_LIST}'
    )


def test_unknown_alias_in_a_model_without_aliases(jit):
    assert resolve_error(SavedModel.load(jit), [{"function_alias": "tpu_func"}]) == (
        'tpu_functions[0]: unknown function alias "tpu_func"; the SavedModel has no function aliases '
        "(export with tf.saved_model.SaveOptions(function_aliases=...))"
    )


def test_unknown_concrete_name(jit):
    model = SavedModel.load(jit)
    outer = next(n for n in model.functions if n.startswith("__inference_jit_outer_"))
    typo = outer.replace("outer", "outr")
    assert resolve_error(model, [{"concrete_function_name": typo}]) == (
        f'tpu_functions[0]: unknown concrete function "{typo}" (did you mean "{outer}"?); aliases: none'
    )


def test_unknown_concrete_name_lists_aliases(model):
    message = resolve_error(model, [{"concrete_function_name": "nothing_like_it"}])
    listed = ", ".join(f'"{a}" ({n})' for n, a in sorted(model.aliases.items(), key=lambda i: i[1]))
    assert message == f'tpu_functions[0]: unknown concrete function "nothing_like_it"; aliases: {listed}'


def test_unknown_signature(model):
    assert resolve_error(model, [{"signature_name": "serving_defualt"}]) == (
        'tpu_functions[0]: unknown signature "serving_defualt" (did you mean "serving_default"?); '
        'signatures: "serve_again", "serve_chains", "serve_control_flow", "serve_two", "serving_default"'
    )


def test_same_function_named_twice(model):
    name = name_of(model, "tpu_func")
    assert resolve_error(model, [{"function_alias": "tpu_func"}, {"concrete_function_name": name}]) == (
        f'tpu_functions[1]: concrete_function_name "{name}" names function {name}, '
        'already named by tpu_functions[0] (function_alias "tpu_func")'
    )


def test_indirect_call_between_tpu_functions_is_refused(model):
    message = resolve_error(model, [{"function_alias": "outer_indirect"}, {"function_alias": "inner"}])
    assert message == (
        'Unable to place both "outer_indirect" and "inner" on the TPU because "outer_indirect" '
        "indirectly calls \"inner\". This behavior is unsupported because it can cause invalid graphs "
        "to be generated."
    )


def test_direct_call_between_tpu_functions_is_allowed(model):
    found = resolve_tpu_functions(model, [{"function_alias": "outer_direct"}, {"function_alias": "inner"}])
    assert [f.alias for f in found] == ["outer_direct", "inner"]


def test_signature_indirectly_calling_a_tpu_function_is_refused(model):
    # serving_default's wrapper -> serve -> tpu_func: two levels, so indirect.
    message = resolve_error(model, [{"signature_name": "serving_default"}, {"function_alias": "tpu_func"}])
    wrapper = model.signatures["serving_default"]
    assert message == (
        f'Unable to place both "{wrapper}" and "tpu_func" on the TPU because "{wrapper}" indirectly '
        'calls "tpu_func". This behavior is unsupported because it can cause invalid graphs to be generated.'
    )


def test_jit_compile_without_jit_functions(model):
    assert resolve_error(model, [{"jit_compile_functions": True}]) == (
        "tpu_functions[0]: jit_compile_functions is true but no function was exported with "
        "@tf.function(jit_compile=True)"
    )
