"""The generated C++ of a ``new-op --schema`` package, piece by piece from its
:class:`~.schema.OpSignature`: the compute core (argument struct, shape rule, forward, backward),
the torch library's kernels and registrations (LibTorch's stable ABI), and the ONNX Runtime kernel. Each function
returns ``{template key: text}``."""

from __future__ import annotations

from .schema import OWN_DTYPES, OpSignature

_CPP_ATTR = {"int": "int64_t", "ints": "std::vector<int64_t>", "float": "float", "floats": "std::vector<float>",
             "bool": "bool"}
_TORCH_ATTR = {"int": "int64_t", "ints": "torch_glue::IntList", "float": "double", "floats": "torch_glue::FloatList",
               "bool": "bool"}
PY_ATTR = {"int": "int", "ints": "list[int]", "float": "float", "floats": "list[float]", "bool": "bool"}


def wrap(head: str, items, tail: str = "", indent: int = 0, width: int = 110, sep: str = ",") -> str:
    """``head + items joined by sep + " " + tail`` (a call, a signature, adjacent string literals
    with ``sep=""``), its items wrapped onto more lines when it would pass ``width`` at ``indent``
    (the first line's indent, which the caller writes): aligned after ``head``, or, when ``head``
    is long, on lines of their own indented 4 more than the first."""
    items = list(items)
    one = head + f"{sep} ".join(items) + tail
    if indent + len(one) <= width or not items:
        return one
    hanging = len(head) > 48
    column = indent + 4 if hanging else indent + len(head)
    lines, line = ([head.rstrip()], "") if hanging else ([], head)
    for k, item in enumerate(items):
        piece = item + (sep if k < len(items) - 1 else tail)
        if line in ("", head):
            line = (" " * column if line == "" else head) + piece
        elif len(line) + (0 if lines or hanging else indent) + 1 + len(piece) > width:  # the first line's indent
            lines.append(line)
            line = " " * column + piece
        else:
            line = f"{line} {piece}"
    lines.append(line)
    return "\n".join(lines)


def literal_pieces(text: str, width: int = 60) -> list:
    """``text`` as double-quoted literals of about ``width`` characters, split after spaces (for
    adjacent string literals, which Python and C++ both join)."""
    pieces, current = [], ""
    for word in text.split(" "):
        candidate = f"{current} {word}" if current else word
        if current and len(candidate) > width:
            pieces.append(current + " ")
            current = word
        else:
            current = candidate
    pieces.append(current)
    return ['"' + p.replace("\\", "\\\\").replace('"', '\\"') + '"' for p in pieces]


def _cpp_comment(text: str, indent: int = 2, width: int = 110) -> str:
    """``text`` as C++ ``//`` comment lines at ``indent``, wrapped at ``width``."""
    import textwrap

    prefix = " " * indent + "// "
    return "\n".join(textwrap.wrap(text, width=width, initial_indent=prefix, subsequent_indent=prefix,
                                   break_long_words=False, break_on_hyphens=False))


def placeholder_math(sig: OpSignature) -> str:
    """The placeholder, in words (docstrings, README, comments)."""
    x = sig.primary.name
    floats = " + ".join(a.name for a in sig.float_attrs)
    formula = f"{x} * (1 + {floats})" if floats else f"{x} * 1 (a copy of {x})"
    every = "every output" if len(sig.outputs) > 1 else "the output"
    unused = [a.name for a in sig.args if a is not sig.primary and a.kind != "float"]
    tail = f"; {', '.join(unused)} unused" if unused else ""
    return f"{every} = {formula}, shaped like {x}{tail}"


def _cpp_scale(sig: OpSignature) -> str:
    return " + ".join(["F(1)"] + [f"static_cast<F>(args.{a.name})" for a in sig.float_attrs])


def core_blocks(sig: OpSignature, camel: str) -> dict:
    x = sig.primary.name
    fields = []
    for a in sig.args:
        if a.is_tensor:
            element = OWN_DTYPES[a.dtype][0] if a.dtype else "F"
            note = f"{a.declaration}" + (f": {a.dtype}" if a.dtype else "") + \
                (" (present == false when not given)" if a.optional else "") + (", no gradient" if a.no_grad else "")
            fields.append(f"  Input<{element}> {a.name};  // {note}")
        else:
            init = {"int": " = 0", "ints": "", "float": " = 0", "floats": "", "bool": " = false"}[a.kind]
            note = {"float": ": float32, the value ONNX stores (torch rounds its double to it)",
                    "floats": ": float32 values, as ONNX stores them (torch rounds its doubles to them)",
                    "bool": ": an int attribute 0/1 in ONNX"}.get(a.kind, "")
            fields.append(f"  {_CPP_ATTR[a.kind]} {a.name}{init};  // {a.declaration}{note}")
    shape_fields = []
    for a in sig.args:
        if a.is_tensor:
            note = a.declaration + (" (present == false when not given)" if a.optional else "")
            shape_fields.append(f"  Shape<Dim> {a.name};  // {note}")
        else:
            shape_fields.append(fields[sig.args.index(a)])
    shapes_of = [f"  in.{a.name} = {{args.{a.name}.shape, args.{a.name}.present}};" if a.is_tensor else
                 f"  in.{a.name} = args.{a.name};" for a in sig.args]
    every_shape = ", ".join([f"in.{x}.dims"] * len(sig.outputs))
    unused = [a.name for a in sig.args if a is not sig.primary and a.kind != "float"]
    unused_text = f" {', '.join(unused)} {'is' if len(unused) == 1 else 'are'} not used." if unused else ""
    floats = " + ".join(a.name for a in sig.float_attrs)
    scale_words = f"1 + {floats} (the float attributes)" if floats else "1 (there are no float attributes)"
    derivative = (f"and {sig.name}_backward below, its derivative" if sig.backward == "cpp" else
                  f"its derivative is _backward in {sig.name}.py")
    output_ptrs = "\n".join(f"  F* {o} = alloc({k}, shapes[{k}]);" for k, o in enumerate(sig.outputs))
    stores = "\n".join(f"      {o}[i] = scaled;" for o in sig.outputs)
    note = _cpp_comment(f"PLACEHOLDER: replace with the op's math. Each output is {x} * placeholder_scale, with "
                        f"placeholder_scale = {scale_words}, shaped like {x}.{unused_text}")
    forward = f"""  // The outputs' shapes, and every check of shapes and attributes: the shape rule above, which
  // torch's fake impl and ONNX shape inference run too.
  std::vector<std::vector<int64_t>> shapes;
  const std::string error = {sig.name}_output_shapes({sig.name}_shapes(args), shapes);
  if (!error.empty()) return error;
  if (shapes.size() != {len(sig.outputs)})
    return message("{sig.name}_output_shapes gave ", shapes.size(), " shape(s) for {len(sig.outputs)} output(s)");
{note}
  const F placeholder_scale = {_cpp_scale(sig)};
  const F* {x} = args.{x}.data;
{output_ptrs}
  parallel_for(args.{x}.numel(), int64_t(1) << 14, [&](int64_t begin, int64_t end) {{
    for (int64_t i = begin; i < end; ++i) {{
      const F scaled = {x}[i] * placeholder_scale;
{stores}
    }}
  }});
  return "";"""
    blocks = {
        "CORE_ARG_FIELDS": "\n".join(fields),
        "CORE_SHAPE_FIELDS": "\n".join(shape_fields),
        "CORE_SHAPES_OF_BODY": "\n".join(shapes_of),
        "CORE_RULE_OUT": f"  out = {{{every_shape}}};",
        "CORE_FORWARD_BODY": forward,
        "CORE_HEADER_NOTE": _cpp_comment(f"The function to write is {sig.name}_forward ({derivative}). Until you "
                                         f"do, it computes a PLACEHOLDER: {placeholder_math(sig)}.", 0),
        "CORE_OUTPUT_LIST": ", ".join(f"{k}: {o}" for k, o in enumerate(sig.outputs)),
        "CORE_FORWARD_SIGNATURE": wrap(f"std::string {sig.name}_forward(", [
            f"const {camel}Args<F>& args", "const Alloc& alloc", "const ParallelFor& parallel_for"], ") {"),
        "CORE_GRADS_STRUCT": "",
        "CORE_BACKWARD": "",
    }
    if sig.backward == "cpp":
        grads = "\n".join(f"  Input<F> {o};" for o in sig.outputs)
        blocks["CORE_GRADS_STRUCT"] = f"""
// The gradients of {sig.name}'s outputs, each shaped like its output (generated from the schema).
template <typename F>
struct {camel}Grads {{
{grads}
}};
"""
        grad_list = ", ".join(f"{k}: {a.name}" for k, a in enumerate(sig.grad_inputs))
        grad_sum = " + ".join(f"grad_{o}[i]" for o in sig.outputs)
        grad_sum = f"({grad_sum})" if len(sig.outputs) > 1 else grad_sum
        others = [a for a in sig.grad_inputs if a is not sig.primary]
        zero_words = (f" {', '.join(a.name for a in others)} {'does' if len(others) == 1 else 'do'} not enter it: "
                      "zero gradients.") if others else ""
        lines = [f"  const F placeholder_scale = {_cpp_scale(sig)};"]
        lines += [f"  const F* grad_{o} = grads.{o}.data;" for o in sig.outputs]
        lines += [f"  F* grad_{a.name} = alloc({k}, args.{a.name}.shape);" for k, a in enumerate(sig.grad_inputs)]
        lines.append(f"  parallel_for(args.{x}.numel(), int64_t(1) << 14, [&](int64_t begin, int64_t end) {{")
        lines.append(f"    for (int64_t i = begin; i < end; ++i) grad_{x}[i] = {grad_sum} * placeholder_scale;")
        lines.append("  });")
        lines += [f"  std::fill(grad_{a.name}, grad_{a.name} + args.{a.name}.numel(), F(0));" for a in others]
        body = "\n".join(lines)
        no_grad = (f" {', '.join(sig.no_grad)} {'has' if len(sig.no_grad) == 1 else 'have'} none (--no-grad): "
                   "nothing is computed or allocated for it.") if sig.no_grad else ""
        backward_note = _cpp_comment(f"PLACEHOLDER: the exact derivative of the placeholder forward: each output is "
                                     f"{x} * placeholder_scale, so grad_{x} = (the sum of the outputs' gradients) * "
                                     f"placeholder_scale.{zero_words}")
        backward_doc = "\n".join([
            _cpp_comment(f"{sig.name}'s backward (`--backward cpp`): the gradient of each float input from the "
                         "forward's arguments and the outputs' gradients. Returns \"\" or an error message, like "
                         f"{sig.name}_forward." + no_grad, 0),
            _cpp_comment(f"  alloc(k, shape) -> F*: allocates the gradient of float input k ({grad_list}), which "
                         "must have that input's shape: contiguous, row-major, uninitialised (write every element).",
                         0)])
        blocks["CORE_BACKWARD"] = f"""
{backward_doc}
// The autograd formula in {sig.name}.py calls it through the op _{sig.name}_backward.
template <typename F, typename Alloc, typename ParallelFor>
{wrap(f"std::string {sig.name}_backward(", [f"const {camel}Args<F>& args", f"const {camel}Grads<F>& grads",
                                             "const Alloc& alloc", "const ParallelFor& parallel_for"], ") {")}
{backward_note}
{body}
  return "";
}}
"""
    return blocks


def torch_blocks(sig: OpSignature, pkg: str, camel: str) -> dict:
    x = sig.primary.name
    check_params = [f"const Tensor& {t.name}" for t in sig.tensors]

    def check(condition: str, *message: str, optional: str = "") -> str:
        """An opforge::check line (its message's parts are all evaluated: an optional tensor's check runs
        only when the tensor is given)."""
        if optional:
            return f"  if ({optional}.defined())\n    " + wrap("opforge::check(", [condition, "kOp", *message], ");",
                                                             indent=4)
        return "  " + wrap("opforge::check(", [condition, "kOp", *message], ");", indent=2)

    def dtype(t: str) -> str:
        return f"opforge::dtype_name({t}.scalar_type())"

    checks = [check(f"opforge::is_supported_float({x}.scalar_type())", f'": {x} has dtype "', dtype(x),
                    '"; supported dtypes are float32, float64, float16 and bfloat16"')]
    for t in sig.tensors:
        if t is sig.primary:
            continue
        given = t.name if t.optional else ""
        if t.dtype is None:
            checks.append(check(f"{t.name}.scalar_type() == {x}.scalar_type()", f'": {t.name} has dtype "',
                                dtype(t.name), f'" but {x} has dtype "', dtype(x), '"; they must match"',
                                optional=given))
        else:
            checks.append(check(f"{t.name}.scalar_type() == {OWN_DTYPES[t.dtype][1]}", f'": {t.name} has dtype "',
                                dtype(t.name), f'" but must be {t.dtype}"', optional=given))
    checks.append("  " + wrap("opforge::check_same_device(kOp, {", [f'{{"{t.name}", &{t.name}}}' for t in sig.tensors],
                               "});", indent=2))

    core_params = [f"const Tensor& {a.name}" if a.is_tensor else f"{_TORCH_ATTR[a.kind]} {a.name}"
                   for a in sig.args]

    def float_note(a) -> list:
        return ["  // ONNX stores float attributes as float32: compute with that value"] \
            if a is sig.float_attrs[0] else []

    body = []
    for a in sig.args:
        if a.is_tensor:
            element = OWN_DTYPES[a.dtype][0] if a.dtype else "F"
            body.append(f"  args.{a.name} = torch_glue::input<{element}>({a.name});")
        elif a.kind == "ints":
            body.append(f"  args.{a.name} = {a.name}.vec();")
        elif a.kind == "float":
            body += float_note(a) + [f"  args.{a.name} = static_cast<float>({a.name});"]
        elif a.kind == "floats":
            body.append(f"  args.{a.name}.assign({a.name}.begin(), {a.name}.end());  // each rounded to float32, "
                        "as ONNX stores it")
        else:
            body.append(f"  args.{a.name} = {a.name};")

    # The shape rule: its arguments in the op's order, each tensor as its shape, read from RuleArgs.
    rule_body, rule_signature = [], []
    for i, a in enumerate(sig.args):
        if a.is_tensor:
            rule_body.append(f"  in.{a.name} = args.shape({i});" +
                             ("  // present == false when not given" if a.optional else ""))
            rule_signature.append(f"SymInt[]{'?' if a.optional else ''} {a.name}")
            continue
        rule_signature.append(a.declaration)
        if a.kind == "float":
            rule_body += float_note(a) + [f"  in.{a.name} = static_cast<float>(args.real({i}));"]
        elif a.kind == "floats":
            rule_body.append(f"  in.{a.name} = torch_glue::floats(args, {i});  // each rounded to float32, as ONNX "
                             "stores it")
        else:
            reader = {"int": "integer", "ints": "integers", "bool": "boolean"}[a.kind]
            rule_body.append(f"  in.{a.name} = args.{reader}({i});")
    rule_op = f"_{sig.name}_output_shapes"
    rule = f"""{_cpp_comment(f"{sig.name}'s shape rule, core::{sig.name}_output_shapes on RuleDim dims (a size that may be "
                          "symbolic under dynamic shapes), registered below as "
                          f"{pkg}::{rule_op}: each tensor argument is its shape. The fake impl and ONNX shape "
                          f"inference run it (opforge.ShapeRule in {sig.name}.py), so they check and size exactly "
                          "as the kernels do.", 0)}
std::string {sig.name}_output_shapes(const torch_glue::RuleArgs& args, torch_glue::RuleShapes& out) {{
  core::{camel}Shapes<torch_glue::RuleDim> in;
{chr(10).join(rule_body)}
  return torch_glue::rule_result(core::{sig.name}_output_shapes(in, out), out, {len(sig.outputs)}, kOp);
}}
"""
    signature = "(" + ", ".join(rule_signature) + ")"
    function = f"{pkg}::{sig.name}_output_shapes"
    one_line = f'OPFORGE_SHAPE_RULE({pkg}, {rule_op}, "{signature}", {function});'
    if len(one_line) <= 110:
        registration = one_line
    else:  # the signature as adjacent literals, one argument a line
        indent = " " * len("OPFORGE_SHAPE_RULE(")
        pieces = literal_pieces(signature, 110 - len(indent) - 3)
        registration = "\n".join([f"OPFORGE_SHAPE_RULE({pkg}, {rule_op},", *(indent + p for p in pieces[:-1]),
                                  f"{indent}{pieces[-1]},", f"{indent}{function});"])
    rule_registration = _cpp_comment(f"The shape rule {pkg}::{rule_op}, with its arguments' signature "
                                     "(opforge/torch_shape_rule.h).", 0) + "\n" + registration

    def params(a):
        if a.is_tensor:
            return f"const std::optional<Tensor>& {a.name}" if a.optional else f"const Tensor& {a.name}"
        return f"{_TORCH_ATTR[a.kind]} {a.name}"

    forward_params = [params(a) for a in sig.args]
    check_call = ", ".join(f"{t.name}.value_or(Tensor())" if t.optional else t.name for t in sig.tensors)
    prepared = "\n".join(
        f"  const Tensor {t.name}_in = torch_glue::prepared({t.name}{'' if t.dtype else ', compute'});"
        for t in sig.tensors)
    core_call = wrap("core_args<F>(", [f"{a.name}_in" if a.is_tensor else a.name for a in sig.args], "),", indent=8)

    def returns(n):
        return "Tensor" if n == 1 else "std::tuple<" + ", ".join(["Tensor"] * n) + ">"

    def converted(n):
        items = [f"opforge::to_dtype(outputs[{k}], dtype)" for k in range(n)]
        return items[0] if n == 1 else "{" + ", ".join(items) + "}"

    n_out = len(sig.outputs)
    forward = f"""{_cpp_comment(f"The CPU kernel of {pkg}::{sig.name}: checks, then the core on contiguous tensors "
                             "(float ones in the compute type), the outputs converted back to the inputs' dtype.", 0)}
{wrap(f"{returns(n_out)} {sig.name}_cpu(", forward_params, ") {")}
  check_args({check_call});
  const opforge::ScalarType dtype = {x}.scalar_type(), compute = torch_glue::compute_type(dtype);
{prepared}
  std::vector<Tensor> outputs({n_out});
  opforge::dispatch_compute(compute, kOp, [&]<typename F>() {{  // F: float or double
    const std::string err = core::{sig.name}_forward(
        {core_call}
        torch_glue::Allocator<F>{{&outputs, {x}, compute, kOp, "{sig.name}_forward"}}, torch_glue::ParallelFor{{}});
    opforge::check(err.empty(), kOp, ": ", err);
  }});
  torch_glue::check_allocated(outputs, kOp, "{sig.name}_forward");
  return {converted(n_out)};
}}
"""
    blocks = {
        "TORCH_CHECK_SIGNATURE": wrap("void check_args(", check_params, ") {"),
        "TORCH_CHECKS": "\n".join(checks),
        "TORCH_CORE_ARGS_SIGNATURE": wrap(f"core::{camel}Args<F> core_args(", core_params, ") {"),
        "TORCH_CORE_ARGS_BODY": "\n".join(body),
        "TORCH_FORWARD": forward.rstrip("\n"),
        "TORCH_SHAPE_RULE": rule.rstrip("\n"),
        "TORCH_SHAPE_RULE_REGISTRATION": rule_registration,
        "TORCH_BACKWARD": "",
        "TORCH_BACKWARD_NOTE": "",
        "TORCH_DEF": _def_line(sig.schema),
        "TORCH_DEF_BACKWARD": "",
        "TORCH_IMPL_BACKWARD": "",
    }
    if sig.backward == "cpp":
        n_grad = len(sig.grad_inputs)
        grad_params = [f"const Tensor& grad_{o}" for o in sig.outputs]
        grad_prepared = "\n".join(f"  const Tensor grad_{o}_in = torch_glue::prepared(grad_{o}, compute);"
                                  for o in sig.outputs)
        grads_set = "\n".join(f"    grads.{o} = torch_glue::input<F>(grad_{o}_in);" for o in sig.outputs)
        names = ", ".join(a.name for a in sig.grad_inputs)
        blocks["TORCH_BACKWARD"] = f"""
constexpr const char* kBackwardOp = "{pkg}::_{sig.name}_backward";

{_cpp_comment(f"The CPU kernel of {pkg}::_{sig.name}_backward: the gradients of {names} from the outputs' "
             f"gradients (core::{sig.name}_backward). Autograd calls it; it has no derivative of its own.", 0)}
{wrap(f"{returns(n_grad)} {sig.name}_backward_cpu(", grad_params + forward_params, ") {")}
  check_args({check_call});
  const opforge::ScalarType dtype = {x}.scalar_type(), compute = torch_glue::compute_type(dtype);
{prepared}
{grad_prepared}
  std::vector<Tensor> outputs({n_grad});
  opforge::dispatch_compute(compute, kBackwardOp, [&]<typename F>() {{  // F: float or double
    core::{camel}Grads<F> grads;
{grads_set}
    const std::string err = core::{sig.name}_backward(
        {core_call[:-1]}, grads,
        torch_glue::Allocator<F>{{&outputs, {x}, compute, kBackwardOp, "{sig.name}_backward"}},
        torch_glue::ParallelFor{{}});
    opforge::check(err.empty(), kBackwardOp, ": ", err);
  }});
  torch_glue::check_allocated(outputs, kBackwardOp, "{sig.name}_backward");
  return {converted(n_grad)};
}}
"""
        blocks["TORCH_BACKWARD_NOTE"] = f"\n// Also the backward op _{sig.name}_backward and its CPU kernel (--backward cpp)."
        blocks["TORCH_DEF_BACKWARD"] = "\n  " + _def_line(_canonical(sig.backward_schema))
        blocks["TORCH_IMPL_BACKWARD"] = (f'\n  m.impl("_{sig.name}_backward", '
                                         f"TORCH_BOX(&{pkg}::{sig.name}_backward_cpu));")
    return blocks


def _def_line(schema: str, indent: int = 2) -> str:
    """``m.def("<schema>");``, the schema split into adjacent literals when the line would be long."""
    return wrap("m.def(", literal_pieces(schema, 100 - indent), ");", indent=indent, sep="")


def _canonical(schema: str) -> str:
    """``schema`` as torch prints it (what TORCH_LIBRARY declares and register_op compares)."""
    import torch

    return str(torch._C.parse_schema(schema))


def ort_blocks(sig: OpSignature) -> dict:
    members, reads = [], []
    if any(t.optional for t in sig.tensors):
        listed = [f'{{"{t.name}", {"true" if t.optional else "false"}}}' for t in sig.tensors]
        reads.append("    " + wrap("ort_glue::check_node_inputs(info, kOp, {", listed, f"}}, {len(sig.outputs)});",
                                    indent=4))
    else:
        reads.append("    " + wrap("opforge::ort::check_node_arity(info, kOp, {", [f'"{t.name}"' for t in sig.tensors],
                                    f"}}, {len(sig.outputs)});", indent=4))
    for a in sig.attrs:
        if a.kind == "float":
            members.append(f"  float {a.name} = 0;  // float32 in ONNX; the torch kernel rounds its double to the same value")
            reads.append(f'    {a.name} = opforge::ort::node_attribute<float>(info, kOp, "{a.name}");')
        elif a.kind == "int":
            members.append(f"  int64_t {a.name} = 0;")
            reads.append(f'    {a.name} = opforge::ort::node_attribute<int64_t>(info, kOp, "{a.name}");')
        elif a.kind == "ints":
            members.append(f"  std::vector<int64_t> {a.name};")
            reads.append(f'    {a.name} = ort_glue::node_ints(info, kOp, "{a.name}");')
        elif a.kind == "floats":
            members.append(f"  std::vector<float> {a.name};")
            reads.append(f'    {a.name} = ort_glue::node_floats(info, kOp, "{a.name}");')
        else:
            members.append(f"  bool {a.name} = false;  // an int attribute 0/1 in ONNX")
            reads.append(f'    {a.name} = ort_glue::node_bool(info, kOp, "{a.name}");')
    params = ["OrtKernelContext* ctx"]
    body = []
    for t in sig.tensors:
        element = OWN_DTYPES[t.dtype][0] if t.dtype else "T"
        tensor = f"Ort::Custom::Tensor<{element}>"
        params.append(f"std::optional<const {tensor}*> {t.name}" if t.optional else f"const {tensor}& {t.name}")
        body.append(f"    args.{t.name} = ort_glue::float_input({t.name}, widened);" if not t.dtype else
                    f"    args.{t.name} = ort_glue::typed_input({t.name});")
    body += [f"    args.{a.name} = {a.name};" for a in sig.attrs]
    params += [f"Ort::Custom::Tensor<T>& {o}" for o in sig.outputs]
    return {
        "ORT_ATTR_MEMBERS": "\n".join(members) + ("\n" if members else ""),
        "ORT_ATTR_READS": "\n".join(reads),
        "ORT_COMPUTE_SIGNATURE": wrap("Ort::Status Compute(", params, ") {", indent=2),
        "ORT_ARGS_BODY": "\n".join(body),
        "ORT_OUTPUT_PTRS": "{" + ", ".join(f"&{o}" for o in sig.outputs) + "}",
    }
