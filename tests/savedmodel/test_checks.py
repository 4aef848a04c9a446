"""TPU-compatibility checks: boundary dtypes, sparse inputs, XLA kernels, XLA lowering."""

from __future__ import annotations

import pytest

from tpubuild.errors import ConversionError
from tpubuild.savedmodel.model import SavedModel
from tpubuild.stages.base import StageContext
from tpubuild.stages.tpu import run
from tpubuild.tpu.compatibility import check_tpu_functions
from tpubuild.tpu.functions import resolve_tpu_functions


@pytest.fixture(scope="module")
def model(zoo) -> SavedModel:
    return SavedModel.load(zoo)


def check_error(model: SavedModel, alias: str) -> str:
    functions = resolve_tpu_functions(model, [{"function_alias": alias}])
    with pytest.raises(ConversionError) as err:
        check_tpu_functions(model, functions)
    return str(err.value)


def who(model: SavedModel, alias: str) -> str:
    name = {a: n for n, a in model.aliases.items()}[alias]
    return f'tpu function "{alias}" (alias of {name})'


def test_string_input(model):
    assert check_error(model, "string_in") == (
        f"{who(model, 'string_in')}: input 's' has dtype string, which TPUs do not support"
    )


def test_float64_input(model):
    assert check_error(model, "f64_in") == (
        f"{who(model, 'f64_in')}: input 'x' has dtype float64, which TPUs do not support"
    )


def test_sparse_input(model):
    assert check_error(model, "sparse_in") == (
        f"{who(model, 'sparse_in')}: input 'sp' is a SparseTensor, which TPUs do not support"
    )


def test_op_without_xla_kernel(model):
    assert check_error(model, "string_op") == (
        f"{who(model, 'string_op')}: op 'StringToNumber' (node StringToNumber) has no XLA kernel "
        "and cannot run on the TPU"
    )


def test_xla_lowering_failure(model):
    assert check_error(model, "dynamic_shape") == (
        f"{who(model, 'dynamic_shape')}: XLA cannot compile it: Input 1 to node `Reshape` with op "
        "Reshape must be a compile-time constant."
    )


@pytest.mark.parametrize("alias", ["tpu_func", "control_flow", "outer_direct", "outer_indirect"])
def test_compatible_functions_pass(model, alias):
    # outer_indirect's variable reaches it through two callers: resolved through call sites.
    assert check_tpu_functions(model, resolve_tpu_functions(model, [{"function_alias": alias}])) == []
    # The checks read the model without changing it.
    assert model.call_sites({a: n for n, a in model.aliases.items()}["tpu_func"])


def test_signature_function_passes(model):
    functions = resolve_tpu_functions(model, [{"signature_name": "serve_chains"}])
    assert check_tpu_functions(model, functions) == []


def test_stage_fails_before_writing_anything(zoo, tmp_path):
    out = tmp_path / "out"
    out.mkdir()
    options = {"tags": ["serve"], "tpu_functions": [{"function_alias": "string_op"}], "xla_sharding_options": None}
    context = StageContext(workspace=tmp_path)
    with pytest.raises(ConversionError) as err:
        run(zoo, out, options, context)
    assert str(err.value) == (
        f"{who(SavedModel.load(zoo), 'string_op')}: op 'StringToNumber' (node StringToNumber) "
        "has no XLA kernel and cannot run on the TPU"
    )
    assert list(out.iterdir()) == []
