"""Insert BatchFunction ops: around call sites of a function, or around a whole signature."""

from __future__ import annotations

import hashlib
from dataclasses import dataclass, field
from typing import Any

from tensorflow.core.framework.function_pb2 import FunctionDef
from tensorflow.core.framework.node_def_pb2 import NodeDef

from tpubuild.savedmodel import fnedit
from tpubuild.savedmodel.fnedit import TPU_CALL
from tpubuild.savedmodel.model import SavedModel, node_functions

ORDINAL_OP = "TPUOrdinalSelector"


@dataclass
class BatchSite:
    """One call node to wrap: `node` in library function `caller` calls `callee`."""

    caller: str
    node: NodeDef
    callee: str

    def __post_init__(self) -> None:
        # A snapshot: the live node is replaced (and its neighbours edited) while batching.
        snapshot = NodeDef()
        snapshot.CopyFrom(self.node)
        self.node = snapshot

    @property
    def tin(self) -> list[int]:
        return fnedit.type_list(self.node, "Tin")

    @property
    def batched(self) -> list[int]:
        """Argument positions concatenated along dimension 0 (not resources / variants)."""
        return [i for i, t in enumerate(self.tin) if t not in fnedit.UNBATCHABLE]

    @property
    def captured(self) -> list[int]:
        """Argument positions passed through whole (variables and other handles)."""
        return [i for i, t in enumerate(self.tin) if t in fnedit.UNBATCHABLE]


@dataclass
class BatchedSite:
    caller: str
    node: str
    callee: str
    wrapper: str
    shared_name: str
    batched_inputs: int
    captured_inputs: int
    outputs: int
    tpu: bool = field(default=False)

    def summary(self) -> dict[str, Any]:
        return dict(self.__dict__)


def batch_attrs(options: dict[str, Any]) -> dict[str, Any]:
    """The BatchFunction attrs for one `batch_options` entry (canonical form)."""
    return {
        "num_batch_threads": options["num_batch_threads"],
        "max_batch_size": options["max_batch_size"],
        "batch_timeout_micros": options["batch_timeout_micros"],
        "allowed_batch_sizes": list(options.get("allowed_batch_sizes", [])),
        "max_enqueued_batches": options["max_enqueued_batches"],
        "enable_large_batch_splitting": not options.get("disable_large_batch_splitting", False),
    }


def model_digest(sm: SavedModel) -> str:
    """A digest of the model being batched: its graph and the checksums of its weights.

    BatchFunction's queue is a resource looked up by (container, shared_name) in the
    process's ResourceMgr (tensorflow/core/kernels/batch_kernels.cc,
    BatchFunctionKernel::ComputeAsync, LookupOrCreate): two models loaded into one server
    whose nodes carry the same name share one queue, with the options of whichever
    created it, and a batch mixing their requests runs the function of its last request
    (BatchResource::ProcessFuncBatchImpl uses last_task.fhandle) on all of them. C++
    loaders keep shared_name as written (Python's loader appends a per-load suffix:
    fix_node_def in tensorflow/python/saved_model/function_deserialization.py). Two
    fine-tunes of one network have identical graphs, so the weights count too; they are
    represented by variables.index, which records a CRC32C of every tensor's bytes
    (tensorflow/core/protobuf/tensor_bundle.proto, BundleEntryProto.crc32c), so the digest
    costs kilobytes of reading, not gigabytes. Same input, same digest: builds stay
    deterministic.
    """
    digest = hashlib.blake2b(digest_size=16)
    digest.update(sm.meta_graph.SerializeToString(deterministic=True))
    index = sm.path / "variables" / "variables.index"
    if index.is_file():
        digest.update(index.read_bytes())
    return digest.hexdigest()


def shared_name(model: str, caller: str, node: str) -> str:
    """The queue name of one call site of one model (`model` is `model_digest`'s value)."""
    digest = hashlib.blake2b(f"{model}/{caller}/{node}".encode(), digest_size=8).hexdigest()
    return f"tpubuild_batch_{digest}"


def _wrapper(sm: SavedModel, site: BatchSite) -> FunctionDef:
    """The function BatchFunction runs: batched args first, then captured, then the call."""
    callee = sm.functions[site.callee]
    order = site.batched + site.captured
    wrapper = FunctionDef()
    wrapper.signature.name = sm.unique_name(f"__tpubuild_batched_{site.callee}")
    wrapper.signature.is_stateful = True
    args = {}
    for position, index in enumerate(order):
        arg = wrapper.signature.input_arg.add(name=f"arg{index}", type=site.tin[index])
        args[index] = arg.name
        if index in callee.arg_attr:
            wrapper.arg_attr[position].CopyFrom(callee.arg_attr[index])
    inner = NodeDef()
    inner.CopyFrom(site.node)
    del inner.input[:]
    inner.input.extend(args[i] for i in range(len(order)))
    if site.node.op == TPU_CALL:
        # The device ordinal is chosen inside the batched function, so the TPU call
        # (which the CPU twin maps back) stays the body of what BatchFunction runs.
        selector = NodeDef(name="tpu_ordinal", op=ORDINAL_OP)
        fnedit.fill_default_attrs(selector)
        wrapper.node_def.append(selector)
        inner.input.append(fnedit.first_output_ref(selector))
    wrapper.node_def.append(inner)
    for j, dtype in enumerate(fnedit.type_list(site.node, "Tout")):
        wrapper.signature.output_arg.add(name=f"out{j}", type=dtype)
        wrapper.ret[f"out{j}"] = fnedit.output_ref(inner, j)
    return wrapper


def batch_site(sm: SavedModel, site: BatchSite, options: dict[str, Any], model: str) -> BatchedSite:
    """Replace the call node by a BatchFunction whose function makes the same call.

    `model` is `model_digest(sm)` taken before the first site was batched.
    """
    old = site.node
    tin, batched, captured = site.tin, site.batched, site.captured
    wrapper = sm.add_function(_wrapper(sm, site))
    caller = sm.functions[site.caller]
    args = fnedit.data_inputs(old)
    ordinal_ref = args.pop() if old.op == TPU_CALL else None
    batch = NodeDef(name=old.name, op="BatchFunction", device=old.device)
    batch.input.extend(args[i] for i in batched + captured)
    batch.input.extend(fnedit.control_inputs(old))
    batch.attr["f"].func.name = wrapper.signature.name
    fnedit.set_attr_types(batch, "Tin", [tin[i] for i in batched])
    fnedit.set_attr_types(batch, "Tcaptured", [tin[i] for i in captured])
    tout = fnedit.type_list(old, "Tout")
    fnedit.set_attr_types(batch, "Tout", tout)
    for key, value in batch_attrs(options).items():
        if key == "allowed_batch_sizes":
            batch.attr[key].list.i.extend(value)
        elif isinstance(value, bool):
            batch.attr[key].b = value
        else:
            batch.attr[key].i = value
    shared = shared_name(model, site.caller, old.name)
    batch.attr["shared_name"].s = shared.encode()
    batch.attr["batching_queue"].s = shared.encode()
    fnedit.fill_default_attrs(batch)
    node = next(n for n in caller.node_def if n.name == old.name)
    node.Clear()
    node.CopyFrom(batch)
    fnedit.replace_refs(
        caller, {fnedit.output_ref(old, j): f"{old.name}:out_tensors:{j}" for j in range(len(tout))}
    )
    if ordinal_ref is not None:
        _drop_if_unused(caller, ordinal_ref.split(":")[0])
    sm.invalidate()
    return BatchedSite(
        caller=site.caller,
        node=old.name,
        callee=site.callee,
        wrapper=wrapper.signature.name,
        shared_name=shared,
        batched_inputs=len(batched),
        captured_inputs=len(captured),
        outputs=len(tout),
        tpu=old.op == TPU_CALL,
    )


def _drop_if_unused(fdef: FunctionDef, name: str) -> None:
    """Remove node `name` when nothing reads it any more (the old TPU ordinal selector)."""
    used = any(
        ref.lstrip("^").split(":")[0] == name for node in fdef.node_def for ref in node.input
    ) or any(ref.split(":")[0] == name for ref in fdef.ret.values())
    if used:
        return
    for index, node in enumerate(fdef.node_def):
        if node.name == name and node.op == ORDINAL_OP:
            del fdef.node_def[index]
            return


def split_signature(sm: SavedModel, fn: str) -> BatchSite:
    """Move signature function `fn`'s body into a copy; `fn` becomes one call to the copy."""
    # The same split the tpu stage makes for signature-named TPU functions (one copy of it).
    from tpubuild.tpu.placement import split_wrapper

    body = split_wrapper(sm, fn)
    (node,) = [n for n in sm.functions[fn].node_def if body in node_functions(n)]
    return BatchSite(caller=fn, node=node, callee=body)
