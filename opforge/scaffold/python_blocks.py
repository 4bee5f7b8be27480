"""The generated Python of a ``new-op --schema`` package, piece by piece from its
:class:`~.schema.OpSignature`: the spec, wrapper, autograd and module, example arguments, tests
and README; and :func:`schema_substitutions`, every template key at once."""

from __future__ import annotations

from typing import Optional

from .cpp_blocks import PY_ATTR, core_blocks, literal_pieces, ort_blocks, placeholder_math, torch_blocks, wrap
from .names import NewOp
from .schema import OWN_DTYPES, OpSignature, SchemaArg


#: The example sizes new-op writes (EXAMPLE_SIZES and BENCHMARK_SIZES in the spec module): the
#: tests' two samples and the benchmark's default. "batch" is the dim the tests double.
EXAMPLE_SIZES = ({"batch": 3, "n": 5}, {"batch": 2, "n": 7})
BENCHMARK_SIZES = {"batch": 64, "n": 4096}


def _literal(value) -> str:
    """``value`` (str, int, tuple, dict of them) as Python source, strings double-quoted."""
    if isinstance(value, str):
        return '"' + value + '"'
    if isinstance(value, tuple):
        return "(" + ", ".join(map(_literal, value)) + ("," if len(value) == 1 else "") + ")"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{_literal(k)}: {_literal(v)}" for k, v in value.items()) + "}"
    return repr(value)


def _example_shape(a: SchemaArg) -> tuple:
    """The example shape new-op writes for tensor input ``a`` (EXAMPLE_SHAPES): (batch, n) for a
    float tensor, which the placeholder math takes; 6 values for a tensor of its own type."""
    return (6,) if a.dtype else ("batch", "n")


def _example_value(sig: OpSignature, a: SchemaArg, index: int) -> str:
    """The expression example_args gives for argument ``a`` (``index``: its place among its kind)."""
    if a.is_tensor:
        shape = f'shape["{a.name}"]'
        if a.dtype == "bool":
            value = f"torch.randint(0, 2, {shape}, generator=g).bool()"
            note = "bool"
        elif a.dtype:
            extra = "" if a.dtype == "int64" else f", dtype={OWN_DTYPES[a.dtype][2]}"
            value = f"torch.randint(0, 4, {shape}, generator=g{extra})"
            note = f"{a.dtype}, values in [0, 4)"
        else:
            value = f"torch.randn({shape}, generator=g)"
            note = "float" + (", no gradient" if a.no_grad else "")
        if a.optional and sig.trailing_optional(a):
            return f"{value} if variant == 0 else None,  # {a.name}: {note}, optional (None in variant 1)"
        return f"{value},  # {a.name}: {note}" + (", optional" if a.optional else "")
    if a.kind == "float":
        first, second = 0.5 + 0.25 * index, -(0.25 + 0.125 * index)
        return f"{first!r} if variant == 0 else {second!r},  # {a.name}"
    if a.kind == "int":
        return f"2 if variant == 0 else 3,  # {a.name}"
    if a.kind == "ints":
        return f"[1, 2] if variant == 0 else [3],  # {a.name}"
    if a.kind == "floats":
        return f"[0.5, -1.5] if variant == 0 else [2.0],  # {a.name}"
    return f"variant == 0,  # {a.name}"


def _suffix_defaults(params: list) -> list:
    """(name, annotation, default) -> with defaults kept only on the trailing run that has them all
    (Python needs every parameter after a defaulted one to have a default)."""
    out, defaulted = [], True
    for name, annotation, default in reversed(params):
        defaulted = defaulted and default is not None
        out.append((name, annotation, default if defaulted else None))
    return list(reversed(out))


def _py_params(params: list) -> list:
    """Python parameters ``name: annotation[ = default]`` (defaults on the trailing run only)."""
    return [f"{n}: {t}" + (f" = {d}" if d is not None else "") for n, t, d in _suffix_defaults(params)]


def _doc(text: str, indent: int = 4, width: int = 100) -> str:
    """``text`` wrapped for a docstring whose lines start at ``indent`` (the first line's indent is the
    caller's)."""
    import textwrap

    return textwrap.fill(text, width=width, subsequent_indent=" " * indent, break_long_words=False,
                         break_on_hyphens=False)


def _raise_input_error(condition: str, *message: str) -> list:
    """``if condition: raise opforge.OpInputError(f"..." f"...")`` lines, the message's literals
    wrapped. OpInputError: a RuntimeError, what the kernels raise, and a TypeError and a ValueError."""
    inner = "".join(m[2:-1] if m.startswith("f") else m[1:-1] for m in message)
    merged = ("f" if any(m.startswith("f") for m in message) else "") + f'"{inner}"'
    if len(f"        raise opforge.OpInputError({merged})") <= 110:
        message = (merged,)
    return [f"    if {condition}:", "        " + wrap("raise opforge.OpInputError(", message, ")", indent=8, sep="")]


def description(sig: OpSignature) -> str:
    """What the op is, in two sentences: the generated README, the spec module's docstring and
    ``OpSpec(doc=...)`` each say this (their templates hold only its key)."""
    no_grad = f"; none for {', '.join(sig.no_grad)} (--no-grad)" if sig.no_grad else ""
    return (f"{sig.name}: PLACEHOLDER math, until you write the op's: {placeholder_math(sig)}. Gradients: "
            f"{', '.join(a.name for a in sig.grad_inputs)}{no_grad}.")


def _py_blocks(sig: OpSignature, pkg: str) -> dict:
    x = sig.primary.name
    names = [a.name for a in sig.args]
    tensors = sig.tensors
    checks = _raise_input_error(f"{x}.dtype not in _FLOATS", f'f"{{_OP}}: {x} has dtype {{{x}.dtype}}; "',
                               '"supported dtypes are float32, float64, float16 and bfloat16"')
    for t in tensors:
        if t is sig.primary:
            continue
        given = f"{t.name} is not None and " if t.optional else ""
        if t.dtype is None:
            checks += _raise_input_error(f"{given}{t.name}.dtype != {x}.dtype",
                                        f'f"{{_OP}}: {t.name} has dtype {{{t.name}.dtype}} "',
                                        f'f"but {x} has dtype {{{x}.dtype}}; they must match"')
        else:
            checks += _raise_input_error(f"{given}{t.name}.dtype != {OWN_DTYPES[t.dtype][2]}",
                                        f'f"{{_OP}}: {t.name} has dtype {{{t.name}.dtype}} "',
                                        f'"but must be {t.dtype}"')
    checks.append("    " + wrap("opforge.check_same_device(", ["_OP"] + [f"{t.name}={t.name}" for t in tensors], ")",
                                 indent=4))
    rule_args = [(f"None if {a.name} is None else {a.name}.shape" if a.optional else f"{a.name}.shape")
                 if a.is_tensor else a.name for a in sig.args]
    n_out = len(sig.outputs)
    fake_return = f"{x}.new_empty(shapes[0])" if n_out == 1 else f"tuple({x}.new_empty(output_shape) for output_shape in shapes)"

    grad_names_list = [f"grad_{o}" for o in sig.outputs]
    grads = ", ".join(grad_names_list)

    def unpacked(targets: list, source: str) -> str:
        """``a, b = source`` (parenthesised and wrapped when long)."""
        line = ", ".join(targets) + ("," if len(targets) == 1 else "") + f" = {source}"
        return "    " + (line if len(line) <= 100 else wrap("(", targets, f") = {source}", indent=4))

    setup = ["def _setup_context(ctx, inputs, output) -> None:", unpacked(names, "inputs"),
             "    # every tensor input: what a backward reads",
             "    " + wrap("ctx.save_for_backward(", [t.name for t in tensors], ")", indent=4)]
    if sig.attrs:
        setup.append("    " + wrap("ctx.attrs = (", [a.name for a in sig.attrs], ",)" if len(sig.attrs) == 1 else ")",
                                    indent=4))
    unpack = [unpacked([t.name for t in tensors], "ctx.saved_tensors")]
    if sig.attrs:
        unpack.append(unpacked([a.name for a in sig.attrs], "ctx.attrs"))

    def returning(items: list) -> str:
        line = "return " + ", ".join(items)
        return line if len(line) <= 100 else wrap("return (", items, ")", indent=4)

    if sig.backward == "python":
        grad_sum = " + ".join(f"grad_{o}" for o in sig.outputs)
        grad_sum = f"({grad_sum})" if n_out > 1 else grad_sum
        scale = " + ".join(["1.0"] + [f"_float32({a.name})" for a in sig.float_attrs])
        returned = returning([f"{grad_sum} * placeholder_scale" if a is sig.primary else "None" for a in sig.args])
        no_grad = "\n    " + _doc(f"None for {', '.join(sig.no_grad)} whatever the math: --no-grad, "
                                  "differentiable=False in the spec.", width=96) if sig.no_grad else ""
        autograd = "\n".join(setup) + f'''


def _backward(ctx, {grads}):
    """The inputs' gradients (None where there is none) from the outputs' gradients.{no_grad}

    PLACEHOLDER: the exact derivative of the placeholder math: each output is {x} * placeholder_scale,
    so d/d{x} is (the sum of the outputs' gradients) * placeholder_scale, and no other input enters it.
    Written with torch ops, it runs on every device and is itself differentiable (double backward);
    for speed, move it into a C++ op (what `opforge new-op --backward cpp` writes)."""
''' + "\n".join(unpack) + f'''
    placeholder_scale = {scale}
    {returned}
'''
    else:
        results = ", ".join(f"grad_{a.name}" for a in sig.grad_inputs) + ("," if len(sig.grad_inputs) == 1 else "")
        if len(sig.grad_inputs) == 1:
            results = f"grad_{sig.grad_inputs[0].name}"
        returned = returning([f"grad_{a.name}" if a in sig.grad_inputs else "None" for a in sig.args])
        fake_grads = [f"{a.name}.new_empty({a.name}.shape)" for a in sig.grad_inputs]
        fake_grads = fake_grads[0] if len(fake_grads) == 1 else wrap("(", fake_grads, ")", indent=11)
        grad_names = ", ".join(a.name for a in sig.grad_inputs)
        autograd = "\n".join(setup) + f'''


def _backward(ctx, {grads}):
    """{_doc(f"The gradients of {grad_names} from the C++ op {pkg}::_{sig.name}_backward ({sig.name}_backward "
            f"in csrc/{sig.name}.h); None for the other inputs.")}"""
''' + "\n".join(unpack) + f'''
    {wrap(f"{results} = torch.ops.{pkg}._{sig.name}_backward(", grad_names_list + names, ")", indent=4)}
    {returned}


@torch.library.register_fake("{pkg}::_{sig.name}_backward")
{wrap("def _backward_fake(", grad_names_list + names, "):")}
    return {fake_grads}


def _no_double_backward(ctx, *grads):
    raise RuntimeError(f"{{_OP}}: double backward (a gradient of its gradient) is not implemented: its backward is "
                       "the C++ op {pkg}::_{sig.name}_backward, which has no derivative of its own. The first "
                       "gradients are exact, so use them directly (no create_graph=True through this op), or give "
                       "_{sig.name}_backward an autograd formula")


# The backward op's own backward: a clear error instead of autograd's "not differentiable" warning and None.
torch.library.register_autograd("{pkg}::_{sig.name}_backward", _no_double_backward,
                                setup_context=lambda ctx, inputs, output: None)
'''
    # Optional inputs left out at the end of an ONNX node are not handed over at all (onnx.reference): None
    reference_params = [n + ("=None" if d else "") for n, _, d in
                        _suffix_defaults([(t.name, "", "None" if t.optional else None) for t in tensors])]
    if sig.attrs:
        reference_params += ["*"] + [a.name for a in sig.attrs]
    numpy_scale = " + ".join(["acc(1)"] + [f"acc({a.name})" for a in sig.float_attrs])
    reference_return = "(result,)" if n_out == 1 else f"tuple(result.copy() for _ in range({n_out}))"
    float_index = {a.name: i for i, a in enumerate(sig.float_attrs)}
    examples = "\n".join("        " + _example_value(sig, a, float_index.get(a.name, 0)) for a in sig.args)

    spec_args = []
    for a in sig.args:
        if a.is_tensor:
            extra = (f', dtypes=("{a.dtype}",)' if a.dtype else "") + (", optional=True" if a.optional else "") + \
                (", differentiable=False" if a.no_grad else "")
            spec_args.append(f'        opforge.TensorArg("{a.name}"{extra}, doc="{a.declaration}: {a.description}"),')
        else:
            spec_args.append(f'        opforge.AttrArg("{a.name}", kind="{a.kind}", doc="{a.declaration}: '
                             f'{a.description}"),')
    outputs = ", ".join(f'"{o}"' for o in sig.outputs) + ("," if n_out == 1 else "")

    def annotation(a):
        if a.is_tensor:
            return "Optional[torch.Tensor]" if a.optional else "torch.Tensor"
        return PY_ATTR[a.kind]

    wrapper = [(a.name, annotation(a), a.default) for a in sig.args]
    init = [(a.name, annotation(a), a.default) for a in sig.attrs]
    init_body = "".join(f"\n        self.{a.name} = {'list(' + a.name + ')' if a.kind in ('ints', 'floats') else a.name}"
                        for a in sig.attrs)
    forward = [(t.name, annotation(t), "None" if t.optional else None) for t in tensors]
    call = [a.name if a.is_tensor else f"self.{a.name}" for a in sig.args]
    returns = " -> torch.Tensor" if n_out == 1 else " -> tuple[" + ", ".join(["torch.Tensor"] * n_out) + "]"
    shapes = [f'    "{t.name}": {_literal(_example_shape(t))},' for t in tensors]
    return {
        "PY_EXAMPLE_SHAPES": "\n".join(shapes),
        "PY_EXAMPLE_SIZES": _literal(EXAMPLE_SIZES),
        "PY_BENCHMARK_SIZES": _literal(BENCHMARK_SIZES),
        "OUTPUT_LIST": ", ".join(sig.outputs),
        "TENSOR_LIST": ", ".join(t.name for t in tensors),
        "PY_FAKE_DEF": wrap("def _fake(", names, "):"),
        "PY_CHECK_DEF": wrap("def _check(", [t.name for t in tensors], ") -> None:"),
        "PY_CHECK_CALL": wrap("_check(", [t.name for t in tensors], ")", indent=4),
        "PY_WRAPPER_RETURN": wrap(f"return torch.ops.{pkg}.{sig.name}(", names, ")", indent=8),
        "PY_MODULE_RETURN": wrap(f"return torch.ops.{pkg}.{sig.name}(", call, ")", indent=8),
        "PY_DOC_SCHEMA": _doc(sig.schema, indent=8),
        "PY_DOC_DESCRIPTION": _doc(description(sig), 0),
        "PY_REFERENCE_PLACEHOLDER": _doc(f"PLACEHOLDER: {placeholder_math(sig)}."),
        "PY_SPEC_SCHEMA": wrap("schema=", literal_pieces(sig.schema, 96), ",", indent=4, sep=""),
        "PY_SPEC_DOC": wrap("doc=", literal_pieces(description(sig), 96), ",", indent=4, sep=""),
        "PY_CHECKS": "\n".join(checks),
        "PY_FAKE_SHAPES": wrap("shapes = _shape_rule(", rule_args, ")", indent=4),
        "PY_FAKE_RETURN": fake_return,
        "PY_AUTOGRAD": autograd,
        "PY_REFERENCE_DEF": wrap("def _reference(", reference_params, ") -> tuple:"),
        "PY_NUMPY_SCALE": numpy_scale,
        "PY_REFERENCE_RETURN": reference_return,
        "PY_EXAMPLE_ARGS": examples,
        "PY_SPEC_ARGS": "\n".join(spec_args),
        "PY_SPEC_OUTPUTS": outputs,
        "PY_SPEC_HELPER_OPS": f'\n    helper_ops=("_{sig.name}_backward",),  # a C++ helper op, never exported'
        if sig.backward == "cpp" else "",
        "PY_WRAPPER_DEF": wrap(f"def {sig.name}(", _py_params(wrapper), f"){returns}:"),
        "PY_MODULE_INIT_DEF": wrap("def __init__(", ["self"] + _py_params(init), "):", indent=4),
        "PY_MODULE_INIT_BODY": init_body,
        "PY_MODULE_FORWARD_DEF": wrap("def forward(", ["self"] + _py_params(forward), f"){returns}:", indent=4),
        "BACKWARD_TODO": (f"\n* ``{sig.name}_backward`` in csrc/{sig.name}.h: its derivative (the C++ op "
                          f"``_{sig.name}_backward``);") if sig.backward == "cpp" else
        "\n* ``_backward`` below: its derivative (an autograd formula in torch ops);",
    }


def _test_blocks(sig: OpSignature) -> dict:
    bad = [f'    _bad({sig.args.index(sig.primary)}, torch.int32, "{sig.primary.name}-int32"),']
    for t in sig.tensors:
        if t.dtype:
            wrong = "int64" if t.dtype == "int32" else "int32"
            bad.append(f'    _bad({sig.args.index(t)}, torch.{wrong}, "{t.name}-{wrong}"),')
    return {
        "TEST_BAD_SAMPLES": "\n".join(bad),
        "TEST_OP_TESTS_OPTIONS": ", gradgrad=False" if sig.backward == "cpp" else "",
        "BENCH_BACKWARD_DOC": ", and forward + backward",
    }


def _readme_blocks(sig: OpSignature, spec: NewOp, dtypes: dict) -> dict:
    flags = f" --domain {spec.domain}" if spec.domain != spec.package else ""
    if dtypes:
        flags += " --dtypes " + ",".join(f"{k}={v}" for k, v in dtypes.items())
    if sig.no_grad:
        flags += " --no-grad " + ",".join(sig.no_grad)
    if sig.backward == "cpp":
        flags += " --backward cpp"
    pkg, name = spec.package, sig.name
    if sig.backward == "cpp":
        row = (f"\n| `src/{pkg}/csrc/{name}.h`: `{name}_backward` | its derivative: the gradients of "
               f"{', '.join(a.name for a in sig.grad_inputs)} (the C++ op `_{name}_backward`) |")
        gradgrad = f"; first order only: `_{name}_backward` has no derivative of its own, so the tests pass `gradgrad=False`"
    else:
        row = f"\n| `src/{pkg}/{name}.py`: `_backward` | its derivative (an autograd formula in torch ops) |"
        gradgrad = " and gradgradcheck"
    return {
        "README_GENERATE_FLAGS": flags,
        "README_CALL_ARGS": ", ".join(a.name for a in sig.args),
        "README_BACKWARD_ROW": row,
        "README_GRADGRAD": gradgrad,
        "README_TORCH_BACKWARD": f", backward op `_{name}_backward`" if sig.backward == "cpp" else "",
        "README_ARGUMENTS": "\n".join(f"- `{a.name}`: {a.description}" for a in sig.args) + "\n\nOutputs: " +
        ", ".join(f"`{o}`" for o in sig.outputs) + " (the float inputs' dtype).",
    }


def schema_substitutions(sig: OpSignature, spec: NewOp, dtypes: Optional[dict] = None) -> dict:
    """Every ``{{KEY}}`` of the ``new_op_schema`` templates for ``sig`` (beside :meth:`NewOp.substitutions`)."""
    subs = dict(spec.substitutions())
    subs.update(SCHEMA=sig.schema, DESCRIPTION=description(sig), PRIMARY=sig.primary.name,
                CUDA_SOURCES=spec.cuda_sources("new-op --schema: CPU kernels only"))
    subs.update(core_blocks(sig, spec.camel))
    subs.update(torch_blocks(sig, spec.package, spec.camel))
    subs.update(ort_blocks(sig))
    subs.update(_py_blocks(sig, spec.package))
    subs.update(_test_blocks(sig))
    subs.update(_readme_blocks(sig, spec, dtypes or {}))
    return subs
